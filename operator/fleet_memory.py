"""What one operator process remembers between turns, outside status: the recent traffic
windows the traffic trigger judges and the pods' GPU SKUs. Lost on a restart and rebuilt from
Prometheus within a few windows; nothing here decides anything by itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from spectune.operator.observations import FleetWindow, Traffic


def pod_skus(
    known: Mapping[str, str], window: FleetWindow | None, live: Iterable[str]
) -> dict[str, str]:
    """Pod -> SKU for the live pods: what this window reports, else what an earlier one did.
    A pod never changes node, so a scrape missed under load does not make its SKU unknown
    (and its engine pushed the deployment's threshold for one resync)."""
    seen = dict(known) | ({pod: e.device for pod, e in window.engines.items()} if window else {})
    return {pod: seen[pod] for pod in live if pod in seen}


def record_window(
    windows: Sequence[tuple[datetime, Traffic]],
    now: datetime,
    traffic: Traffic,
    keep: int = 3,
) -> list[tuple[datetime, Traffic]]:
    """The last `keep` consecutive traffic windows the traffic-shift trigger judges: a window
    read at `now` is added once the last one has fully passed, so windows never overlap."""
    if windows and (now - windows[-1][0]).total_seconds() < traffic.seconds:
        return list(windows)
    return [*windows, (now, traffic)][-keep:]
