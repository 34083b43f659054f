"""Which of a SpecDeployment's children a turn must apply: pure, so a steady fleet costs the
API server no write and no read. A child is applied when its rendered content moved since the
last apply, when the live object moved since (a hand edit, a delete: what the operator's
watches of its children show), or, for a kind no watch covers (the PodMonitor), once every
REPAIR_SECONDS. Before, every 10 s turn read and force-applied every child: at 100
SpecDeployments, about 30 writes and 30 reads a second for nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# A child no watch covers is applied again this often, to repair what was done to it by hand.
REPAIR_SECONDS = 300.0
# The kinds whose live objects the operator watches (kopf indexes in handlers.py).
WATCHED = ("ConfigMap", "Deployment", "Service")


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
