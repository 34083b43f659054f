"""What one operator process remembers between turns, outside status: the recent traffic
windows the traffic trigger judges. Lost on a restart and rebuilt from Prometheus within a few
windows; nothing here decides anything by itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from spectune.operator.observations import Traffic


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
