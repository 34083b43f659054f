"""What the status says about the engines: pure, so tested without a cluster."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from spectune.operator.models import ThresholdStatus, parse_spec
from spectune.operator.status import (
    degraded,
    merge_patch,
    rollout_conditions,
    threshold_status,
    unready_pods,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def pod(name: str, ready: str, message: str = "", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    condition = {"type": "Ready", "status": ready, "reason": "EngineNotReady", "message": message}
    return {"metadata": meta, "status": {"conditions": [condition]}}


def test_unready_pods_say_why_and_skip_ready_and_leaving_ones() -> None:
    pods = [
        pod("llm-b", "False", "engine not ready: GET /readyz answered 503"),
        pod("llm-a", "True"),
        pod("llm-c", "False", "gone soon", deleting=True),
        {"metadata": {"name": "llm-d"}, "status": {}},  # not started: no conditions yet
    ]
    assert unready_pods(pods) == [
        "llm-b: engine not ready: GET /readyz answered 503",
        "llm-d: not ready",
    ]


def test_crashing_engines_make_the_specdeployment_not_ready_and_say_why() -> None:
    # The Deployment has its pods, but none counts as ready: their engines do not serve.
    rollout = {"replicas": 2, "updatedReplicas": 2, "readyReplicas": 0}
    unready = ["llm-x: engine exited with code 1: no such model", "llm-y: engine exited"]
    ready, progressing, degraded = rollout_conditions(2, rollout, unready, [], NOW)
    assert ready.type == "Ready" and ready.status == "False"
    assert ready.reason == "ReplicasNotReady"
    assert ready.message == (
        "0/2 engine replicas ready; llm-x: engine exited with code 1: no such model (and 1 more)"
    )
    assert progressing.status == "True" and degraded.status == "False"


def test_ready_when_every_replica_is_ready_and_the_transition_time_holds() -> None:
    rollout = {"replicas": 2, "updatedReplicas": 2, "readyReplicas": 2}
    (ready, *_) = rollout_conditions(2, rollout, [], [], NOW)
    assert ready.status == "True" and ready.message == "2/2 engine replicas ready"
    later = datetime(2026, 1, 2, tzinfo=UTC)
    (again, *_) = rollout_conditions(2, rollout, [], [ready.model_dump()], later)
    assert again.lastTransitionTime == ready.lastTransitionTime


def test_prometheus_down_degrades_unless_the_rollout_already_does() -> None:
    rollout = {"replicas": 2, "updatedReplicas": 2, "readyReplicas": 2}
    down = degraded(
        rollout_conditions(2, rollout, [], [], NOW), "PrometheusUnavailable", "refused", NOW, []
    )
    says = next(c for c in down if c.type == "Degraded")
    assert says.status == "True" and says.reason == "PrometheusUnavailable"
    assert says.message == "refused"
    failure = {"type": "ReplicaFailure", "status": "False", "reason": "FailedCreate"}
    failing = rollout | {"conditions": [failure]}
    (*_, rollout_says) = degraded(
        rollout_conditions(2, failing, [], [], NOW), "PrometheusUnavailable", "x", NOW, []
    )
    assert rollout_says.reason == "FailedCreate"


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies a status patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = apply_merge_patch(out.get(k), v)
    return out


def test_a_status_patch_replaces_maps_instead_of_merging_them() -> None:
    """A later calibration's maps (per-SKU bounds, a window's buckets) replace the earlier
    ones': a stale bound would otherwise fire the past-bound trigger forever."""
    old = {
        "phase": "Verifying",
        "changedAt": "t0",
        "baseline": {"bounds": {"H100": 24, "L4": 8}, "replicas": 2},
        "beforeSteps": {"H100": {"4": {"steps": 9}}},
    }
    new = {"phase": "Idle", "baseline": {"bounds": {"L4": 12}, "replicas": 3}, "beforeSteps": {}}
    assert apply_merge_patch(old, new)["baseline"]["bounds"] == {"H100": 24, "L4": 12}  # merged
    assert apply_merge_patch(old, merge_patch(old, new)) == new
    assert merge_patch(None, new) == new


def test_auto_without_a_start_value_starts_from_8_within_its_range_and_advisory_from_none() -> None:
    """Auto with no start value runs 8 (raised to `min`, lowered to `max`) until a measurement;
    Advisory changes nothing the engines run, so they speculate always; a value given wins,
    and a measured threshold wins over both."""

    def start(**threshold: Any) -> tuple[int | None, str]:
        spec = parse_spec({"model": {"name": "m"}, "speculation": {"threshold": threshold}})
        t = threshold_status(spec, ThresholdStatus())
        return t.current, t.source

    assert start() == (8, "Default")
    assert start(min=16) == (16, "Default")
    assert start(max=4) == (4, "Default")
    assert start(mode="Advisory") == (None, "Default")
    assert start(value=32) == (32, "Spec")
    assert start(mode="Advisory", value=32) == (32, "Spec")
    spec = parse_spec({"model": {"name": "m"}, "speculation": {"threshold": {}}})
    measured = ThresholdStatus(current=48, source="Measured")
    assert threshold_status(spec, measured) == measured
