"""Leader election's decisions on a coordination.k8s.io/v1 Lease, as pure functions: whether a
candidate may take the Lease, how long a leader may keep trying to renew it, and the Lease as
each write leaves it. The API calls, the renewing thread and kopf around them are in
leadership.py.

Why these cannot let two replicas act at once: every duration is measured on each replica's own
monotonic clock, never by comparing wall-clock times of two hosts. A leader counts from the
moment it *sent* its last successful renewal, before the API server wrote it; a candidate counts
from the moment it first *saw* that write, after. So the candidate's count starts no earlier than
the leader's, and with Timing's defaults (client-go's numbers):

- t+10 s (deadline_s): the leader has not renewed; it stops kopf;
- t+13 s (exit_s): should kopf still be running, the process exits at once (os._exit);
- t+15 s (lease_s): the earliest a candidate takes the Lease over.

That leaves 2 s for the exit to land and for the two clocks' rates to differ. A released Lease
(graceful shutdown: no holder) is taken at the candidate's next poll, within retry_s. A Lease
that does not exist is taken once lease_s have passed since the candidate first found it
missing: someone may have deleted it under a leader, which counts from its last renewal like
any other. (The chart makes a released Lease at install, so a fresh install starts at once.)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

API_VERSION, KIND = "coordination.k8s.io/v1", "Lease"


@dataclass(frozen=True)
class Timing:
    """Seconds: the Lease's duration, the leader's renew period, the candidates' poll and the
    leader's retry period, and when an unrenewed leader stops kopf and then exits."""

    lease_s: int = 15
    renew_s: float = 5.0
    retry_s: float = 2.0
    deadline_s: float = 10.0
    exit_s: float = 13.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_s <= self.renew_s < self.deadline_s < self.exit_s < self.lease_s:
            raise ValueError(f"need 0 < retry <= renew < deadline < exit < lease: {self}")

    def attempt_timeout(self, renewed_at: float, now: float) -> float | None:
        """How long the leader's next API call may take: at most retry_s, and never past the
        deadline; None once the deadline has passed (stop acting)."""
        left = renewed_at + self.deadline_s - now
        return min(self.retry_s, left) if left > 0 else None


@dataclass(frozen=True)
class Record:
    """What a Lease says: its holder ("" when released), for how long, and its version (any
    write changes it)."""

    holder: str
    duration_s: float
    version: str
    transitions: int

    @classmethod
    def of(cls, lease: dict[str, Any]) -> Record:
        spec = lease.get("spec") or {}
        return cls(
            holder=spec.get("holderIdentity") or "",
            duration_s=float(spec.get("leaseDurationSeconds") or 0),
            version=lease["metadata"]["resourceVersion"],
            transitions=int(spec.get("leaseTransitions") or 0),
        )


@dataclass(frozen=True)
class Sighting:
    """A version of the Lease and when (the candidate's monotonic clock) it was first seen."""

    version: str
    since: float


# The version a missing Lease is sighted under.
ABSENT = ""


def sight(last: Sighting | None, record: Record | None, now: float) -> Sighting:
    """The clock restarts whenever the Lease changed since the last look: a holder's renewal,
    or the Lease found missing (None) after it was there, or there after it was missing."""
    version = ABSENT if record is None else record.version
    if last is not None and last.version == version:
        return last
    return Sighting(version, now)


def may_take(
    identity: str, record: Record | None, seen: Sighting, now: float, lease_s: float
) -> bool:
    """Released, already ours (this identity's earlier process is gone: a container restart),
    or unchanged for longer than its duration since this candidate first saw it. A missing
    Lease (None) counts as one a leader may still hold for `lease_s`: deleted under a leader,
    taken at once, it let two replicas act for up to 8 s while the leader counted its exit
    from its last renewal."""
    if record is None:
        return now - seen.since > lease_s
    return record.holder in ("", identity) or now - seen.since > record.duration_s


def stamp(when: datetime) -> str:
    """A Kubernetes MicroTime (acquireTime, renewTime): UTC, microseconds."""
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def taken(
    lease: dict[str, Any] | None,
    namespace: str,
    name: str,
    identity: str,
    timing: Timing,
    now: datetime,
) -> dict[str, Any]:
    """The Lease as `identity` writes it to take it: a new one when `lease` is None, else one
    carrying the read resourceVersion, so that the write fails if anyone wrote since."""
    old = None if lease is None else Record.of(lease)
    spec = {
        "holderIdentity": identity,
        "leaseDurationSeconds": timing.lease_s,
        "acquireTime": stamp(now),
        "renewTime": stamp(now),
        "leaseTransitions": 0 if old is None else old.transitions + (old.holder != identity),
    }
    return _lease(namespace, name, None if old is None else old.version, spec)


def renewed(lease: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The held Lease with its renewTime moved to now."""
    return _rewritten(lease, renewTime=stamp(now))


def released(lease: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The held Lease given up: no holder, so the next candidate takes it at its next poll."""
    return _rewritten(lease, holderIdentity="", renewTime=stamp(now))


def _rewritten(lease: dict[str, Any], **changes: Any) -> dict[str, Any]:
    meta = lease["metadata"]
    spec = (lease.get("spec") or {}) | changes
    return _lease(meta["namespace"], meta["name"], meta["resourceVersion"], spec)


def _lease(namespace: str, name: str, version: str | None, spec: dict[str, Any]) -> dict[str, Any]:
    metadata = {"name": name, "namespace": namespace}
    if version is not None:
        metadata["resourceVersion"] = version
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}
