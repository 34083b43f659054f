"""Each policy on a phase's batches: every policy meets the same batches, each bucket for its
share of the engines' decode time, at the throughput the engines measured for each mode there
(on the GPU's clock); the operator's threshold picks per batch what the engines' gate would;
buckets not measured in both modes are left out, and the share compared says so."""

from __future__ import annotations

import pytest

from spectune.demo.counterfactual import policies_on_batches
from spectune.engine.bench.loadgen import Counters
from spectune.engine.crossover import ModeStats

SCALE = 4.0  # the engines' clock runs this much slower than the GPU's


def ran(buckets: dict[int, tuple[int, float, float]], steps: int = 30) -> Counters:
    """Engines that ran, per bucket, (the batch, seconds per plain step, speculation's speedup
    there): `steps` steps of each mode, a spec step committing 2 tokens per sequence."""
    stats = {}
    for bucket, (batch, step, speedup) in buckets.items():
        stats["plain", bucket] = ModeStats(steps, steps * batch, steps * step)
        spec_step = 2 * step / speedup  # twice the tokens: `speedup` times the tokens/s
        stats["spec", bucket] = ModeStats(steps, steps * batch * 2, steps * spec_step)
    return Counters(stats, 0, 0, 2 * steps * len(buckets), 0.0)


# speculation pays at 26 (1.2x), not at 52 (0.9x) or 70 (0.8x); the crossover is near 40
PHASE = ran({24: (26, 0.04, 1.2), 48: (52, 0.05, 0.9), 64: (70, 0.06, 0.8)})


def compare(threshold: int | None, counters: Counters = PHASE):
    c = policies_on_batches(counters, threshold, SCALE)
    assert c is not None
    return c


def test_every_policy_meets_the_same_batches_at_the_throughput_measured_there() -> None:
    c = compare(40)
    assert [(b.bucket, b.batch) for b in c.batches] == [(24, 26), (48, 52), (64, 70)]
    seconds = [30 * (0.04 + 0.04 * 2 / 1.2), 30 * (0.05 + 0.05 * 2 / 0.9), 30 * (0.06 + 0.12 / 0.8)]
    assert [b.share for b in c.batches] == pytest.approx([s / sum(seconds) for s in seconds])
    assert c.compared == pytest.approx(1.0)
    for b, step, speedup in zip(c.batches, (0.04, 0.05, 0.06), (1.2, 0.9, 0.8), strict=True):
        assert b.never == pytest.approx(b.batch / step * SCALE)  # on the GPU's clock
        assert b.always == pytest.approx(b.never * speedup)
    tps = c.gpu_tokens_per_s
    assert tps["never"] == pytest.approx(sum(b.share * b.never for b in c.batches))
    assert tps["always"] == pytest.approx(sum(b.share * b.always for b in c.batches))


def test_auto_speculates_at_the_batches_below_its_threshold_as_the_gate_does() -> None:
    first, second, third = compare(40).batches

    def auto(threshold: int | None) -> float:
        return compare(threshold).gpu_tokens_per_s["auto"]

    assert auto(40) == pytest.approx(
        first.share * first.always + second.share * second.never + third.share * third.never
    )
    assert auto(26) == auto(0)  # speculate while the batch is below it: not at 26
    assert auto(27) == auto(40)
    assert auto(53) == pytest.approx(
        first.share * first.always + second.share * second.always + third.share * third.never
    )
    tps = compare(None).gpu_tokens_per_s
    assert tps["auto"] == tps["always"]  # no threshold: always speculate
    tps = compare(0).gpu_tokens_per_s
    assert tps["auto"] == tps["never"]


def test_a_threshold_at_the_crossover_beats_both_fixed_policies_one_far_off_does_not() -> None:
    """The check the verdict makes: auto at the crossover speculates where that pays and
    stops where it does not."""
    right = compare(40).gpu_tokens_per_s
    assert right["auto"] > max(right["never"], right["always"]), right
    late = compare(96).gpu_tokens_per_s
    assert late["auto"] == late["always"] < right["auto"]
    early = compare(8).gpu_tokens_per_s
    assert early["auto"] == early["never"] < right["auto"]


def test_buckets_not_measured_in_both_modes_are_left_out_and_the_share_says_so() -> None:
    counters = ran({24: (26, 0.04, 1.2), 48: (52, 0.05, 0.9)})
    counters.steps["spec", 64] = ModeStats(40, 40 * 140, 40 * 0.15)  # no plain step there
    counters.steps["plain", 96] = ModeStats(19, 19 * 100, 19 * 0.08)  # and too few spec ones
    counters.steps["spec", 96] = ModeStats(40, 40 * 200, 40 * 0.2)
    c = compare(40, counters)
    assert [b.bucket for b in c.batches] == [24, 48]
    left_out = 40 * 0.15 + 19 * 0.08 + 40 * 0.2
    both = sum(s.seconds for (_, b), s in counters.steps.items() if b in (24, 48))
    assert c.compared == pytest.approx(both / (both + left_out))
    assert sum(b.share for b in c.batches) == pytest.approx(1.0)


def test_a_phase_without_a_bucket_in_both_modes_has_nothing_to_compare() -> None:
    only_plain = Counters({("plain", 24): ModeStats(30, 780, 1.0)}, 0, 0, 30, 0.0)
    assert policies_on_batches(only_plain, 40, SCALE) is None
    nothing = Counters({("spec", 24): ModeStats(0, 0, 0.0)}, 0, 0, 0, 0.0)
    assert policies_on_batches(nothing, 40, SCALE) is None
