"""The operator's flags without a cluster: target label names from flags, else the
environment, else the reader's defaults, and the exploration lease, handed to the handlers in
kopf's memo."""

from __future__ import annotations

import dataclasses

import kopf
import pytest

from spectune.operator import cli
from spectune.operator.prometheus import LabelNames


def memo(*argv: str) -> kopf.Memo:
    """The memo `spectune-operator run ARGV` would give the handlers (kopf is not run)."""
    return cli.handler_memo(cli.parser().parse_args(["run", *argv]))


def test_the_flags_name_every_label_the_reader_knows() -> None:
    assert tuple(f.name for f in dataclasses.fields(LabelNames)) == cli.LABELS


def test_label_names_default_to_the_readers(monkeypatch: pytest.MonkeyPatch) -> None:
    for target in cli.LABELS:
        monkeypatch.delenv(f"SPECTUNE_PROMETHEUS_{target.upper()}_LABEL", raising=False)
    given = memo("--prometheus-url=http://prom:9090")
    assert given.prometheus_labels == LabelNames()
    assert given.prometheus_url == "http://prom:9090"


def test_label_names_from_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECTUNE_PROMETHEUS_NAMESPACE_LABEL", "kube_namespace")
    monkeypatch.setenv("SPECTUNE_PROMETHEUS_POD_LABEL", "kube_pod")
    given = memo("--prometheus-pod-label=pod_name")
    assert given.prometheus_labels == LabelNames(namespace="kube_namespace", pod="pod_name")


def test_the_exploration_lease_reaches_the_handlers_and_is_refused_below_two_resyncs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert memo().exploration_lease == 60.0
    assert memo("--exploration-lease", "30").exploration_lease == 30.0
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--exploration-lease", "5"])
    assert exit_.value.code == 2
    assert "--exploration-lease: must be between 20 and 86400 seconds, got 5" in (
        capsys.readouterr().err
    )


def test_the_engine_image_flag_reaches_the_handlers_and_is_unset_by_default() -> None:
    """Unset, the handlers run render.ENGINE_IMAGE (the chart always sets the flag)."""
    assert memo().engine_image is None
    assert memo("--engine-image", "reg.example/engine:2").engine_image == "reg.example/engine:2"
