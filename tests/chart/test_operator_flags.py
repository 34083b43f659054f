"""The operator flags and metrics the chart relies on, without a cluster."""

from __future__ import annotations

import pytest

from spectune.operator import metrics


def test_leader_election_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart names the Lease; its namespace defaults to the pod's (resolved at run time)."""
    from spectune.operator import cli

    seen: list[tuple[str | None, str]] = []
    monkeypatch.setattr(
        cli,
        "_run",
        lambda a: seen.append((a.leader_election_namespace, a.leader_election_lease)) or 0,
    )
    cli.main(["run"])
    cli.main(["run", "--leader-election-namespace=ops", "--leader-election-lease=sd"])
    assert seen == [(None, "spectune-operator"), ("ops", "sd")]


def test_metrics_follow_the_status() -> None:
    obj = {
        "metadata": {"namespace": "ns", "name": "llm"},
        "spec": {"replicas": 3},
        "status": {
            "readyReplicas": 2,
            "threshold": {"current": 8, "recommended": 12, "source": "Measured"},
            "crossover": {"batchSize": 12, "sku": "NVIDIA-H100-80GB-HBM3"},
            "conditions": [
                {"type": "Degraded", "status": "True", "reason": "EnginesFailing",
                 "lastTransitionTime": "2026-11-30T10:00:00Z"},
            ],
        },
    }  # fmt: skip
    samples = {f.name: f.samples for f in metrics.families([obj])}
    assert {f.name for f in metrics.families([])} == set(metrics.STATUS_METRICS)
    (condition,) = samples[metrics.CONDITION]
    assert condition.labels == {
        "namespace": "ns", "specdeployment": "llm", "type": "Degraded", "status": "True",
        "reason": "EnginesFailing",
    }  # fmt: skip
    assert samples[metrics.CONDITION_TRANSITION][0].value == 1796032800.0
    assert samples[metrics.THRESHOLD][0].value == 8
    assert samples[metrics.THRESHOLD][0].labels["source"] == "Measured"
    assert samples[metrics.RECOMMENDED_THRESHOLD][0].value == 12
    assert samples[metrics.CROSSOVER][0].labels["sku"] == "NVIDIA-H100-80GB-HBM3"
    assert samples[metrics.READY_REPLICAS][0].value == 2
    assert samples[metrics.REPLICAS][0].value == 3
    unmeasured = {"metadata": {"namespace": "ns", "name": "new"}, "spec": {}}
    empty = {f.name: f.samples for f in metrics.families([unmeasured])}
    assert not empty[metrics.THRESHOLD] and not empty[metrics.CROSSOVER]


def test_no_engine_pod_monitors_is_a_run_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    from spectune.operator import cli

    seen: list[bool] = []
    monkeypatch.setattr(cli, "_run", lambda args: seen.append(args.engine_pod_monitors) or 0)
    cli.main(["run", "--no-engine-pod-monitors"])
    cli.main(["run"])
    assert seen == [False, True]


def test_pod_monitor_flags_are_checked_and_reach_the_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from spectune.operator import cli
    from spectune.operator.render import PodMonitorSettings

    seen: list[PodMonitorSettings | None] = []
    monkeypatch.setattr(cli, "_run", lambda args: seen.append(cli.pod_monitor_settings(args)))
    cli.main(["run", "--pod-monitor-label", "release=kps", "--pod-monitor-label",
              "example.com/team=", "--pod-monitor-interval", "1m30s"])  # fmt: skip
    cli.main(["run"])
    cli.main(["run", "--no-engine-pod-monitors", "--pod-monitor-label", "release=kps"])
    assert seen == [
        PodMonitorSettings("1m30s", {"release": "kps", "example.com/team": ""}),
        PodMonitorSettings("15s", {}),
        None,
    ]
    for bad, says in (
        (["--pod-monitor-label", "release"], "not a Kubernetes label KEY=VALUE: 'release'"),
        (["--pod-monitor-label", "re lease=x"], "not a Kubernetes label"),
        (["--pod-monitor-interval", "30"], "not a Prometheus duration such as 15s or 1m: '30'"),
    ):
        with pytest.raises(SystemExit) as exit:
            cli.main(["run", *bad])
        assert exit.value.code == 2
        assert says in capsys.readouterr().err
