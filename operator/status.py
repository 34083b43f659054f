"""What a SpecDeployment's status says, computed from what was observed. Pure: `now` is
a parameter and the inputs are plain dicts."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from spectune.operator.damping import clamp
from spectune.operator.models import (
    DEFAULT_START_THRESHOLD,
    Condition,
    SpecDeploymentSpec,
    ThresholdStatus,
)


def threshold_status(spec: SpecDeploymentSpec, current: ThresholdStatus) -> ThresholdStatus:
    """Manual pins the spec's value. Otherwise a measured threshold, once there is one,
    wins over the spec's start value; with neither, Auto starts from the default start value
    and Advisory, which changes nothing the engines run, leaves them speculating always."""
    t = spec.speculation.threshold
    if t.mode == "Manual":
        return ThresholdStatus(current=t.value, recommended=current.recommended, source="Spec")
    if current.source == "Measured":
        return current
    if t.value is not None:
        return ThresholdStatus(current=t.value, recommended=current.recommended, source="Spec")
    start = clamp(DEFAULT_START_THRESHOLD, t.min, t.max) if t.mode == "Auto" else None
    return ThresholdStatus(current=start, recommended=current.recommended, source="Default")


def merge_patch(old: Any, new: Any) -> Any:
    """`new` as a JSON merge patch over `old` (RFC 7386, what a status patch is): a key that
    `old` has and `new` lacks is sent as None, which deletes it. A plain `new` would merge
    maps, and a map in status (per-SKU bounds, a window's buckets) would keep the keys of
    every earlier calibration."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    gone = {k: None for k in old if k not in new}
    return {k: merge_patch(old.get(k), v) for k, v in new.items()} | gone


def merge_patched(target: Any, patch: Any) -> Any:
    """`target` with the JSON merge `patch` applied (RFC 7386), as the API server applies a
    status patch: None deletes, mappings merge, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patched(out.get(key), value)
    return out


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


def unready_pods(pods: list[dict[str, Any]]) -> list[str]:
    """`name: why` for each engine pod that exists, is not going away and is not Ready, with
    the reason its kubelet (here the pod runner) wrote: what a user needs when engines fail."""
    out = []
    for pod in pods:
        if pod["metadata"].get("deletionTimestamp"):
            continue
        conditions = (pod.get("status") or {}).get("conditions") or []
        ready = next((c for c in conditions if c.get("type") == "Ready"), {})
        if ready.get("status") != "True":
            why = ready.get("message") or ready.get("reason") or "not ready"
            out.append(f"{pod['metadata']['name']}: {why}")
    return sorted(out)


def ready_since(pod: dict[str, Any]) -> datetime | None:
    """When the pod's Ready condition last turned True; None when it is not Ready (or its
    kubelet wrote no time)."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), {})
    since = ready.get("lastTransitionTime")
    if ready.get("status") != "True" or not since:
        return None
    return datetime.fromisoformat(str(since).replace("Z", "+00:00"))


def ready_message(ready: int, desired: int, unready: list[str]) -> str:
    """How many engines serve, and why the first unready one does not."""
    message = f"{ready}/{desired} engine replicas ready"
    if unready and ready < desired:
        more = f" (and {len(unready) - 1} more)" if len(unready) > 1 else ""
        message += f"; {unready[0]}{more}"
    return message


def rollout_conditions(
    desired: int,
    deployment_status: dict[str, Any],
    unready: list[str],
    previous: list[dict],
    now: datetime,
) -> list[Condition]:
    """Ready / Progressing / Degraded from the engine Deployment's status: its readyReplicas
    count the pods whose engines answer their readiness probe. `unready` (see unready_pods)
    says why the others do not."""
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
            ready_message(ready, desired, unready),
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


def degraded(
    conditions: list[Condition], reason: str, message: str, now: datetime, previous: list[dict]
) -> list[Condition]:
    """Degraded for `reason` (a turn without a window to decide on, children the API server
    refused), unless the rollout already says why it is degraded: that is the more urgent
    news."""
    out = []
    for c in conditions:
        if c.type == "Degraded" and c.status == "False":
            c = condition("Degraded", True, reason, message[:400], now, previous)
        out.append(c)
    return out
