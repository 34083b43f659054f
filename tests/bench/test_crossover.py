"""Pure decisions: per-bucket aggregation, the crossover, the threshold, the gate's verdict."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from spectune.engine.crossover import (
    Crossover,
    ModeStats,
    aggregate,
    aggregate_median,
    bucket_distance,
    difference,
    find_crossover,
    judge_gate,
    speedup_curve,
)


@dataclass
class Step:
    mode: str
    batch_size: int
    tokens: int
    seconds: float


def test_aggregate_sums_decode_steps_per_mode_and_bucket() -> None:
    stats = aggregate(
        [
            Step("prefill", 4, 4, 1.0),
            Step("plain", 4, 4, 0.01),
            Step("plain", 5, 5, 0.01),  # bucket 4
            Step("spec", 6, 18, 0.03),
        ]
    )
    assert stats == {("plain", 4): ModeStats(2, 9, 0.02), ("spec", 6): ModeStats(1, 18, 0.03)}
    assert stats[("plain", 4)].throughput == pytest.approx(450)


def test_median_aggregation_ignores_a_few_slow_steps() -> None:
    steps = [Step("plain", 2, 2, 0.01)] * 4 + [Step("plain", 2, 2, 1.0)]
    stats = aggregate_median(steps)
    assert stats[("plain", 2)] == ModeStats(5, 10, pytest.approx(0.05))
    assert aggregate(steps)[("plain", 2)].seconds == pytest.approx(1.04)


def test_missing_data_is_unknown_not_zero() -> None:
    assert ModeStats().throughput is None
    assert ModeStats().step_seconds is None
    assert speedup_curve({("plain", 1): ModeStats(3, 3, 0.01)}) == []
    assert find_crossover([]) == Crossover("unknown")
    with pytest.raises(ValueError, match="no threshold"):
        _ = Crossover("unknown").threshold


def test_difference_keeps_only_buckets_that_moved() -> None:
    before = {("plain", 1): ModeStats(2, 2, 0.5)}
    after = {("plain", 1): ModeStats(2, 2, 0.5), ("spec", 2): ModeStats(1, 7, 0.1)}
    assert difference(after, before) == {("spec", 2): ModeStats(1, 7, 0.1)}


def test_speedup_curve_pairs_both_modes_in_bucket_order() -> None:
    stats = {
        ("plain", 2): ModeStats(10, 20, 0.1),  # 200 tok/s
        ("spec", 2): ModeStats(10, 60, 0.2),  # 300 tok/s
        ("plain", 1): ModeStats(10, 10, 0.1),
        ("spec", 1): ModeStats(10, 30, 0.1),
        ("spec", 4): ModeStats(1, 10, 0.1),  # no plain partner
    }
    curve = speedup_curve(stats)
    assert [p.batch for p in curve] == [1, 2]
    assert [p.speedup for p in curve] == pytest.approx([3.0, 1.5])


def test_crossover_interpolates_where_speedup_falls_through_one() -> None:
    c = find_crossover([(1, 2.0), (2, 1.6), (4, 1.2), (8, 0.8), (16, 0.5)])
    assert c.status == "crosses"
    assert c.batch == pytest.approx(6.0)
    assert c.threshold == 6  # speculate at 1..5
    assert find_crossover([(1, 1.5), (2, 0.5)]).threshold == 2  # crossover 1.5: only batch 1


def test_crossover_ignores_an_isolated_dip_or_bump() -> None:
    dip = find_crossover([(1, 0.98), (2, 1.5), (4, 1.4), (8, 0.7), (16, 0.6)])
    assert dip.status == "crosses" and 4 < dip.batch < 8
    bump = find_crossover([(1, 1.4), (2, 0.7), (4, 1.02), (8, 0.6)])
    assert bump.status == "crosses" and 1 < bump.batch < 2


def test_crossover_outside_the_measured_range() -> None:
    never = find_crossover([(1, 0.9), (2, 0.8)])
    assert never == Crossover("never_pays", 1) and never.threshold == 0
    always = find_crossover([(1, 1.9), (2, 1.8)])
    assert always == Crossover("always_pays", 2) and always.threshold is None


def test_bucket_distance() -> None:
    a = Crossover("crosses", 5.5)  # bucket 4
    assert bucket_distance(a, Crossover("crosses", 6.2)) == 1  # bucket 6
    assert bucket_distance(a, Crossover("crosses", 13)) == 3  # bucket 12
    assert bucket_distance(Crossover("never_pays", 1), Crossover("crosses", 1.4)) == 1
    assert bucket_distance(Crossover("always_pays", 4), a) == 1  # beyond 4: bucket 6 or up
    assert bucket_distance(Crossover("always_pays", 4), Crossover("crosses", 3.5)) == 2
    assert bucket_distance(a, Crossover("unknown")) is None


def test_gate_verdict() -> None:
    goodput = {
        "never": {1: 1.0, 4: 3.0, 16: 6.0},
        "always": {1: 2.0, 4: 3.5, 16: 4.0},
        "gated": {1: 1.98, 4: 3.5, 16: 5.9},
    }
    verdict = judge_gate(goodput)
    assert [round(v.ratio, 3) for v in verdict.levels] == [0.99, 1.0, 0.983]
    assert verdict.holds
    goodput["gated"][16] = 5.7  # 0.95 of never
    assert not judge_gate(goodput).holds
    zero = {"never": {1: 0.0}, "always": {1: 0.0}, "gated": {1: 0.0}}
    assert judge_gate(zero).levels[0].ratio is None
    assert not judge_gate(zero).holds  # not higher than each in total
