"""Why Prometheus holds no fresh series for a ready engine pod, from its targets API: no scrape
config or PodMonitor selects the pod, one finds it but relabeling drops it, its scrape fails,
or it is scraped without the labels the operator selects engines by. Pure: the reader fetches
the targets, this names the cause the MetricsAvailable condition shows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from spectune.operator.observations import LabelNames

# What Kubernetes pod discovery knows of a target before relabeling.
POD_META, NAMESPACE_META = "__meta_kubernetes_pod_name", "__meta_kubernetes_namespace"
# How long one answer of the targets API serves every SpecDeployment that asks: it lists every
# target of the Prometheus (large on a big one), and each deployment with an overdue pod asks
# every turn. A pod discovered since shows as "no target" for at most this long.
TARGETS_TTL_SECONDS = 30.0


@dataclass(frozen=True)
class ScrapeTarget:
    """One target of Prometheus's targets API (`/api/v1/targets?state=any`)."""

    pool: str  # the scrape config (a PodMonitor's is podMonitor/NAMESPACE/NAME/N)
    labels: Mapping[str, str] = field(default_factory=dict)  # after relabeling; none if dropped
    discovered: Mapping[str, str] = field(default_factory=dict)  # before relabeling
    health: str = "unknown"  # up, down or unknown
    error: str = ""  # the last scrape's error
    dropped: bool = False  # discovered, then dropped by relabeling


class TargetsCache:
    """Prometheus's targets, fetched at most once per `ttl` seconds, shared by the turns of
    every SpecDeployment (their threads)."""

    def __init__(self, ttl: float = TARGETS_TTL_SECONDS) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._at: float | None = None
        self._targets: list[ScrapeTarget] = []

    def get(self, now: float, fetch: Callable[[], list[ScrapeTarget]]) -> list[ScrapeTarget]:
        """The cached answer while younger than the ttl at `now` (seconds), else `fetch()`'s
        (a failed fetch raises and caches nothing)."""
        with self._lock:
            if self._at is None or not 0 <= now - self._at < self.ttl:
                self._targets, self._at = fetch(), now
            return self._targets


def why_unscraped(
    targets: Sequence[ScrapeTarget],
    pods: Sequence[str],
    namespace: str,
    names: LabelNames,
) -> dict[str, str]:
    """Pod -> the likeliest reason its engine series are missing (`pods` in `namespace`, their
    series selected by the label `names`)."""
    return {pod: _why(targets, pod, namespace, names) for pod in pods}


def _why(targets: Sequence[ScrapeTarget], pod: str, namespace: str, names: LabelNames) -> str:
    mine = [t for t in targets if _of(t, pod, namespace, names)]
    if not mine:
        return "Prometheus has no target for it: no PodMonitor or scrape config selects the pod"
    active = [t for t in mine if not t.dropped]
    if not active:
        pools = ", ".join(sorted({t.pool for t in mine}))
        return f"Prometheus discovers it ({pools}) but its relabeling drops it"
    if all(t.health == "down" for t in active):
        return f"its scrape fails ({active[0].pool}: {active[0].error[:160]})"
    want = {names.namespace: namespace, names.pod: pod}
    for t in active:
        wrong = sorted(k for k, v in want.items() if t.labels.get(k) != v)
        if wrong:
            carried = ", ".join(sorted(k for k in t.labels if not k.startswith("__")))
            return (
                f"scraped ({t.pool}) without the label(s) {', '.join(wrong)} the operator "
                f"selects engines by (its labels: {carried}; the --prometheus-*-label flags "
                "name others)"
            )
    pools = ", ".join(sorted({t.pool for t in active}))
    return f"scraped ({pools}) but no fresh spectune_engine_info series yet"


def _of(target: ScrapeTarget, pod: str, namespace: str, names: LabelNames) -> bool:
    """Whether the target is the pod's: by pod discovery's labels, else by its own."""
    seen = target.discovered
    if POD_META in seen:
        return seen[POD_META] == pod and seen.get(NAMESPACE_META) == namespace
    return target.labels.get(names.pod) == pod and target.labels.get(names.namespace) == namespace
