"""Which of a SpecDeployment's children a turn must apply: pure, so a steady fleet costs the
API server no write and no read. A child is applied when its rendered content moved since the
last apply, when the live object moved since (a hand edit, a delete: what the operator's
watches of its children show), or, for a kind no watch covers (the PodMonitor), once every
REPAIR_SECONDS. Before, every 10 s turn read and force-applied every child: at 100
SpecDeployments, about 30 writes and 30 reads a second for nothing.

And which live objects are its own to apply over (`not_owned`): an object of a child's name that
someone else made is left alone, as controller-runtime leaves an object another controller owns.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spectune.operator.render import INSTANCE_LABEL, MANAGED_BY, MANAGED_BY_LABEL

# A child no watch covers is applied again this often, to repair what was done to it by hand.
REPAIR_SECONDS = 300.0
# The kinds whose live objects the operator watches (kopf indexes in handlers.py).
WATCHED = ("ConfigMap", "Deployment", "Service")


@dataclass(frozen=True)
class Refusal:
    """Why a turn's children were not all applied: the Degraded condition's reason (and the
    warning Event's) and its message."""

    reason: str  # ApplyFailed: the API server refused; NotOwned: someone else's object
    message: str


@dataclass(frozen=True)
class Applied:
    """What the last apply of one child sent, and the live object it left."""

    digest: str  # of the rendered child
    identity: str | None  # `identity` of the object the apply returned
    at: float  # unix seconds


def digest(child: Mapping[str, Any]) -> str:
    """The rendered child's content, as a short hash."""
    return hashlib.sha256(json.dumps(child, sort_keys=True).encode()).hexdigest()[:16]


def identity(kind: str, metadata: Mapping[str, Any]) -> str | None:
    """What moves when someone else changes the object: a Deployment's generation (its status,
    which its controller writes all the time, does not move it), else the resourceVersion."""
    value = metadata.get("generation") if kind == "Deployment" else metadata.get("resourceVersion")
    return None if value is None else str(value)


def due(
    child: Mapping[str, Any],
    last: Applied | None,
    live: str | None,
    now: float,
    repair_s: float = REPAIR_SECONDS,
) -> bool:
    """Whether to apply `child` now. `last`: its last apply (None: none in this process);
    `live`: the watched object's identity (None: no such object, or a kind not watched)."""
    if last is None or last.digest != digest(child):
        return True
    if child["kind"] in WATCHED:
        return live != last.identity
    return now - last.at >= repair_s


def not_owned(
    kind: str, metadata: Mapping[str, Any] | None, owner_uid: str, owner_name: str
) -> str | None:
    """Why the live object of a child's name (its `metadata`, None where there is none) is not
    this SpecDeployment's to apply over, or None where it is: absent, controlled by it, or made
    by spectune for a SpecDeployment of this name and orphaned since (`kubectl delete
    --cascade=orphan`; its labels say so). A forced apply and an owner reference would take a
    user's Deployment over, and delete it with the SpecDeployment."""
    if metadata is None:
        return None
    name = metadata.get("name")
    refs = metadata.get("ownerReferences") or []
    controller = next((r for r in refs if r.get("controller")), None)
    if controller is not None:
        if controller.get("uid") == owner_uid:
            return None
        by = f"{controller.get('kind')} {controller.get('name')}"
        return f"{kind} {name} exists and is controlled by {by}: left alone"
    labels = metadata.get("labels") or {}
    if labels.get(MANAGED_BY_LABEL) == MANAGED_BY and labels.get(INSTANCE_LABEL) == owner_name:
        return None
    return (
        f"{kind} {name} exists and was not made by this SpecDeployment: left alone "
        "(delete or rename it, or give the SpecDeployment another name)"
    )
