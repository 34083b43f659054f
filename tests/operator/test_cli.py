"""The operator's flags without a cluster: target label names from flags, else the
environment, else the reader's defaults, and the exploration lease, handed to the handlers in
kopf's memo."""

from __future__ import annotations

import dataclasses
from typing import Any

import kopf
import pytest

from spectune.operator import cli
from spectune.operator.prometheus import LabelNames


def memo(monkeypatch: pytest.MonkeyPatch, *argv: str) -> kopf.Memo:
    """The memo `spectune-operator run ARGV` would give the handlers (kopf is not run)."""
    seen: dict[str, Any] = {}
    monkeypatch.setattr(kopf, "run", lambda **kw: seen.update(kw))
    assert cli.main(["run", *argv]) == 0
    return seen["memo"]


def test_the_flags_name_every_label_the_reader_knows() -> None:
    assert tuple(f.name for f in dataclasses.fields(LabelNames)) == cli.LABELS


def test_label_names_default_to_the_readers(monkeypatch: pytest.MonkeyPatch) -> None:
    for target in cli.LABELS:
        monkeypatch.delenv(f"SPECTUNE_PROMETHEUS_{target.upper()}_LABEL", raising=False)
    given = memo(monkeypatch, "--prometheus-url=http://prom:9090")
    assert given.prometheus_labels == LabelNames()
    assert given.prometheus_url == "http://prom:9090"


def test_label_names_from_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECTUNE_PROMETHEUS_NAMESPACE_LABEL", "kube_namespace")
    monkeypatch.setenv("SPECTUNE_PROMETHEUS_POD_LABEL", "kube_pod")
    monkeypatch.delenv("SPECTUNE_PROMETHEUS_INSTANCE_LABEL", raising=False)
    given = memo(monkeypatch, "--prometheus-pod-label=pod_name", "--prometheus-instance-label=sd")
    assert given.prometheus_labels == LabelNames(
        namespace="kube_namespace", pod="pod_name", instance="sd"
    )


def test_the_exploration_lease_reaches_the_handlers_and_is_refused_below_two_resyncs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert memo(monkeypatch).exploration_lease == 60.0
    assert memo(monkeypatch, "--exploration-lease", "30").exploration_lease == 30.0
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--exploration-lease", "5"])
    assert exit_.value.code == 2
    assert "--exploration-lease: must be between 20 and 86400 seconds, got 5" in (
        capsys.readouterr().err
    )
