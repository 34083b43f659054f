"""Damping: the threshold stays in the spec's range and never flaps."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta

from spectune.operator.damping import bucket_steps, clamp, damp

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_clamp_to_threshold_min_and_max() -> None:
    assert clamp(40, 1, 256) == 40
    assert clamp(None, 1, 256) == 256  # "speculate at every batch" is bounded by max
    assert clamp(0, 1, 256) == 1
    assert clamp(0, 0, 256) == 0
    assert clamp(300, 1, 256) == 256


def test_bucket_steps() -> None:
    assert bucket_steps(12, 15) == 0  # one bucket
    assert bucket_steps(12, 16) == 1
    assert bucket_steps(8, 24) == 3
    assert bucket_steps(0, 1) == 1 and bucket_steps(0, 0) == 0
    assert bucket_steps(None, 512) == float("inf") and bucket_steps(None, None) == 0


DWELL = timedelta(minutes=5)


def test_the_first_measurement_applies_at_once() -> None:
    d = damp(None, 14, 1, 256, last_change=None, now=T0, min_dwell=DWELL)
    assert (d.action, d.threshold) == ("change", 14)


def test_a_move_within_the_dead_band_holds() -> None:
    d = damp(16, 24, 1, 256, last_change=T0 - timedelta(hours=1), now=T0, min_dwell=DWELL)
    assert (d.action, d.threshold) == ("hold", 16)
    assert "dead band" in d.message
    d = damp(16, 32, 1, 256, last_change=T0 - timedelta(hours=1), now=T0, min_dwell=DWELL)
    assert (d.action, d.threshold) == ("change", 32)
    assert d.message == "threshold 16 -> 32"


def test_a_move_before_the_minimum_dwell_waits_and_says_how_long() -> None:
    d = damp(16, 64, 1, 256, last_change=T0 - timedelta(minutes=2), now=T0, min_dwell=DWELL)
    assert (d.action, d.threshold) == ("wait", 16)
    assert d.message == "16 -> 64 waits 3m00s for the minimum dwell"
    d = damp(16, 64, 1, 256, last_change=T0 - DWELL, now=T0, min_dwell=DWELL)
    assert (d.action, d.threshold) == ("change", 64)


def test_damping_clamps_and_holds_an_unchanged_value() -> None:
    d = damp(16, None, 1, 48, last_change=T0 - timedelta(hours=1), now=T0, min_dwell=DWELL)
    assert (d.action, d.threshold) == ("change", 48)
    d = damp(48, 300, 1, 48, last_change=T0, now=T0, min_dwell=DWELL)
    assert (d.action, d.threshold) == ("hold", 48)


def hover(estimates: list[int], current: int, every: timedelta) -> list[datetime]:
    """Apply a calibration's estimate every `every`; returns when the threshold changed."""
    last, changes = T0 - timedelta(hours=1), []
    for i, measured in enumerate(estimates):
        now = T0 + i * every
        d = damp(current, measured, 1, 256, last, now, DWELL)
        if d.action == "change":
            assert d.threshold is not None
            current, last = d.threshold, now
            changes.append(now)
    return changes


def test_estimates_hovering_within_a_bucket_of_the_threshold_never_move_it() -> None:
    rng = random.Random(1)
    estimates = [rng.choice([16, 20, 24, 28, 31]) for _ in range(180)]  # buckets 16 and 24
    assert hover(estimates, 24, timedelta(minutes=2)) == []
    estimates = [rng.choice([24, 28, 32, 40, 47]) for _ in range(180)]  # buckets 24 and 32
    assert hover(estimates, 24, timedelta(minutes=2)) == []


def test_wider_noise_moves_it_no_more_often_than_the_dwell_allows() -> None:
    estimates = [32, 16] * 90  # two buckets apart: beyond the dead band every time
    changes = hover(estimates, 16, timedelta(minutes=1))
    gaps = [b - a for a, b in itertools.pairwise(changes)]
    assert changes and all(gap >= DWELL for gap in gaps)
    assert len(changes) <= 180 // 5 + 1
