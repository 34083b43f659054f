"""How far to move a threshold: clamping to the spec's range, the distance in batch buckets,
and damping (a dead band and a minimum dwell) so that the threshold never flaps. Pure: `now`
is a parameter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from spectune.engine.contract import BATCH_BUCKETS, batch_bucket


def duration_text(d: timedelta) -> str:
    """1h02m or 4m05s: durations in Events and status."""
    s = int(d.total_seconds())
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def clamp(threshold: int | None, low: int, high: int) -> int:
    """Within the spec's threshold.min/max. None (speculate at every batch size) counts as
    above any max, so it becomes `high`; 0 (never speculate) below a positive min."""
    return high if threshold is None else max(low, min(high, threshold))


def bucket_steps(a: int | None, b: int | None) -> float:
    """How many batch buckets apart two thresholds are; 0 (never speculate) sits one bucket
    below the first, None (always speculate) infinitely far above the last."""
    if a == b:
        return 0
    return abs(_bucket_index(a) - _bucket_index(b))


def _bucket_index(threshold: int | None) -> float:
    if threshold is None:
        return math.inf
    return -1 if threshold == 0 else BATCH_BUCKETS.index(batch_bucket(threshold))


# wait: a move the minimum dwell holds back for now (hold: one not worth making)
Action = Literal["change", "hold", "wait"]


@dataclass(frozen=True)
class Damped:
    """What to run: `threshold` is the current value on hold or wait, the new one on change."""

    action: Action
    threshold: int | None
    message: str


def damp(
    current: int | None,
    measured: int | None,
    low: int,
    high: int,
    last_change: datetime | None,
    now: datetime,
    min_dwell: timedelta,
    dead_band_buckets: int = 1,
) -> Damped:
    """Move from `current` to the clamped `measured` threshold only when the move is beyond
    the dead band (the crossover is only located to within a bucket, so a one-bucket move
    is noise) and the last change is at least `min_dwell` old: the threshold never flaps.
    `current` None with no change yet means nothing was measured before: no dead band."""
    target = clamp(measured, low, high)
    if target == current:
        return Damped("hold", current, f"threshold stays at {target}")
    first = current is None and last_change is None
    if not first and bucket_steps(current, target) <= dead_band_buckets:
        return Damped(
            "hold",
            current,
            f"{current} -> {target} is within the dead band of {dead_band_buckets} bucket(s)",
        )
    if last_change is not None and now - last_change < min_dwell:
        wait = duration_text(min_dwell - (now - last_change))
        return Damped("wait", current, f"{current} -> {target} waits {wait} for the minimum dwell")
    return Damped("change", target, f"threshold {current} -> {target}")
