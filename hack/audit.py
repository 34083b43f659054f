"""The local cluster's API server audit log (.local/logs/audit.log and its rotated files): every
call a ServiceAccount made, at Metadata level (hack/cluster/audit-policy.yaml). The tests read
it for what the operator did (the RBAC it needs, that a deposed leader wrote nothing), the
benchmarks for what a fleet costs the API server.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

LOG = Path(__file__).resolve().parent.parent / ".local" / "logs" / "audit.log"
WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass(frozen=True)
class Call:
    """One request as the API server answered it."""

    at: datetime  # when the API server received it
    user: str
    verb: str  # get, list, watch, create, update, patch, delete, ...
    resource: str  # e.g. "pods", "specdeployments/status", "leases"; "" for discovery
    group: str
    namespace: str
    name: str
    code: int
    uri: str

    @property
    def writes(self) -> bool:
        return self.verb in WRITES


def calls(log: Path = LOG) -> Iterator[Call]:
    """Every call in the log, the rotated files first (oldest to newest)."""
    rotated = sorted(log.parent.glob(f"{log.stem}-*{log.suffix}"))
    for path in [*rotated, log]:
        if not path.exists():
            continue
        with path.open() as lines:
            for line in lines:
                if line.strip():
                    yield _call(json.loads(line))


def _call(event: dict) -> Call:
    ref = event.get("objectRef") or {}
    resource = ref.get("resource", "")
    if ref.get("subresource"):
        resource += "/" + ref["subresource"]
    received = event["requestReceivedTimestamp"].replace("Z", "+00:00")
    return Call(
        at=datetime.fromisoformat(received),
        user=(event.get("user") or {}).get("username", ""),
        verb=event.get("verb", ""),
        resource=resource,
        group=ref.get("apiGroup", ""),
        namespace=ref.get("namespace", ""),
        name=ref.get("name", ""),
        code=(event.get("responseStatus") or {}).get("code", 0),
        uri=event.get("requestURI", ""),
    )


def service_account(namespace: str, name: str) -> str:
    """The user name a ServiceAccount's calls carry."""
    return f"system:serviceaccount:{namespace}:{name}"


def by_verb_and_resource(found: Iterable[Call]) -> Counter[tuple[str, str]]:
    """(verb, group/resource) -> how many calls."""
    return Counter((c.verb, f"{c.group}/{c.resource}" if c.group else c.resource) for c in found)
