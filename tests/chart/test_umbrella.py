"""The chart as a dependency of an umbrella chart: the parent's `global` values reach every
subchart, so the schema must let them through, and the parent's values for the subchart apply
(test_chart_cluster.py installs such a parent)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .support import KUBE_VERSION, helm, one, umbrella_chart

pytestmark = [pytest.mark.tools, pytest.mark.usefixtures("helm_binary")]


def test_a_parent_chart_that_sets_global_renders_and_lints(tmp_path: Path) -> None:
    parent = umbrella_chart(
        tmp_path,
        {
            "global": {"foo": "bar"},
            "spectune": {"replicas": 2, "engine": {"image": {"tag": "0.1.0-rc1"}}},
        },
    )
    out = helm("template", "platform", str(parent), "--kube-version", KUBE_VERSION).stdout
    deployment = one([d for d in yaml.safe_load_all(out) if d], "Deployment")
    assert deployment["spec"]["replicas"] == 2
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--engine-image=ghcr.io/spectune/spectune-engine:0.1.0-rc1" in container["args"]
    lint = helm("lint", "--strict", "--kube-version", KUBE_VERSION, str(parent))
    assert "0 chart(s) failed" in lint.stdout
