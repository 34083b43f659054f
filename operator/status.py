"""What a SpecDeployment's status says, computed from what was observed. Pure: `now` is
a parameter and the inputs are plain dicts."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from spectune.operator.models import Condition, SpecDeploymentSpec, ThresholdStatus


def threshold_status(spec: SpecDeploymentSpec, current: ThresholdStatus) -> ThresholdStatus:
    """Manual pins the spec's value. Otherwise a measured threshold, once there is one,
    wins over the spec's start value; with neither, the engines always speculate."""
    t = spec.speculation.threshold
    if t.mode == "Manual":
        return ThresholdStatus(current=t.value, recommended=current.recommended, source="Spec")
    if current.source == "Measured":
        return current
    if t.value is not None:
        return ThresholdStatus(current=t.value, recommended=current.recommended, source="Spec")
    return ThresholdStatus(current=None, recommended=current.recommended, source="Default")


def condition(
    type_: str, ok: bool, reason: str, message: str, now: datetime, previous: list[dict]
) -> Condition:
    """A condition whose lastTransitionTime moves only when its status flips."""
    status = "True" if ok else "False"
    before = next((c for c in previous if c.get("type") == type_), None)
    since = (
        before["lastTransitionTime"]
        if before and before.get("status") == status
        else now.isoformat()
    )
    return Condition(
        type=type_, status=status, reason=reason, message=message, lastTransitionTime=since
    )


def rollout_conditions(
    desired: int, deployment_status: dict[str, Any], previous: list[dict], now: datetime
) -> list[Condition]:
    """Ready / Progressing / Degraded from the engine Deployment's status."""
    ready = deployment_status.get("readyReplicas") or 0
    updated = deployment_status.get("updatedReplicas") or 0
    total = deployment_status.get("replicas") or 0
    failure = next(
        (
            c
            for c in deployment_status.get("conditions") or []
            if c.get("type") in ("ReplicaFailure", "Progressing") and c.get("status") == "False"
        ),
        None,
    )
    settled = ready == desired and updated == desired and total == desired
    return [
        condition(
            "Ready",
            settled,
            "AllReplicasReady" if settled else "ReplicasNotReady",
            f"{ready}/{desired} engine replicas ready",
            now,
            previous,
        ),
        condition(
            "Progressing",
            not settled and failure is None,
            "RollingOut" if not settled else "Stable",
            f"{updated} updated, {total} total, {desired} desired",
            now,
            previous,
        ),
        condition(
            "Degraded",
            failure is not None,
            failure.get("reason", "Failed") if failure else "None",
            failure.get("message", "") if failure else "",
            now,
            previous,
        ),
    ]
