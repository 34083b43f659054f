"""The estimator on synthetic noisy curves whose crossover is known exactly: decode steps drawn
from engine/device_time.py's roofline for simulated GPU SKUs, with per-step and per-bucket
noise, summed per (mode, bucket) as the Prometheus reader gives them."""

from __future__ import annotations

import math
import random

import pytest

from spectune.engine.contract import BATCH_BUCKETS
from spectune.engine.crossover import (
    Crossover,
    ModeStats,
    SpeedupPoint,
    StatsByBucket,
    bucket_distance,
)
from spectune.engine.device_time import (
    LLAMA_1B,
    LLAMA_8B,
    SKUS,
    Setting,
    analytic_crossover,
    expected_tokens,
    plain_step,
    spec_step,
)
from spectune.operator.estimator import (
    CONFIDENT_SE,
    MIN_STEPS,
    Estimate,
    clearly_not_one,
    estimate,
    estimate_by_sku,
    undersampled,
)


def setting(sku: str, acceptance: float = 0.5, context: int = 512) -> Setting:
    return Setting(SKUS[sku], LLAMA_8B, LLAMA_1B, 4, acceptance, context)


def synthetic(
    s: Setting,
    rng: random.Random,
    buckets: tuple[int, ...] = BATCH_BUCKETS,
    steps: dict[str, int] | None = None,
    step_noise: float = 0.15,
    bucket_noise: float = 0.03,
) -> StatsByBucket:
    """Per (mode, bucket) sums of `steps[mode]` iterations at batch sizes drawn across the
    bucket; each step's time carries lognormal noise, each (mode, bucket) a systematic bias
    (other work on the machine), and each spec step's tokens the spread of acceptance."""
    steps = steps or {"plain": 100, "spec": 100}
    per_seq = expected_tokens(s.acceptance, s.k)
    stats: StatsByBucket = {}
    for bucket in buckets:
        upper = BATCH_BUCKETS[BATCH_BUCKETS.index(bucket) + 1] if bucket < 512 else 768
        for mode, n in steps.items():
            bias = math.exp(rng.gauss(0, bucket_noise))
            tokens, seconds = 0, 0.0
            for _ in range(n):
                batch = rng.randrange(bucket, upper)
                contexts = [s.context] * batch
                if mode == "plain":
                    t, made = plain_step(s.sku, s.target, contexts), batch
                else:
                    t = spec_step(s.sku, s.target, s.draft, s.k, contexts)
                    made = max(batch, round(batch * per_seq * math.exp(rng.gauss(0, 0.1))))
                tokens += made
                seconds += t * bias * math.exp(rng.gauss(0, step_noise))
            stats[(mode, bucket)] = ModeStats(n, tokens, seconds)
    return stats


def truth(s: Setting) -> Crossover:
    batch = analytic_crossover(s)
    assert batch is not None
    return Crossover("crosses", batch)


CASES = [(sku, acc) for sku in SKUS for acc in (0.5, 0.7)]


@pytest.mark.parametrize("sku, acceptance", CASES)
def test_noisy_curves_give_the_crossover_within_one_bucket(sku: str, acceptance: float) -> None:
    s = setting(sku, acceptance)
    for seed in range(3):
        est = estimate(s.sku.product, synthetic(s, random.Random(seed)))
        assert est.crossover.status == "crosses", est.reason
        distance = bucket_distance(est.crossover, truth(s))
        assert distance is not None and distance <= 1, (seed, est.reason, truth(s))
        assert est.confidence == 1.0  # 100 steps a mode: a speedup to 1.4% (assumed)
        assert est.threshold == math.ceil(est.crossover.batch or 0)
        assert "crossover at batch" in est.reason


def test_each_sku_gets_its_own_crossover_in_the_order_the_device_model_predicts() -> None:
    rng = random.Random(7)
    stats = {SKUS[k].product: synthetic(setting(k), rng) for k in ("H100", "A100", "L4")}
    found = estimate_by_sku(stats)
    assert set(found) == set(stats)
    batch = {k: found[SKUS[k].product].crossover.batch or 0 for k in ("H100", "A100", "L4")}
    assert batch["A100"] < batch["H100"] < batch["L4"], batch
    for k in batch:
        distance = bucket_distance(found[SKUS[k].product].crossover, truth(setting(k)))
        assert distance is not None and distance <= 1


def test_traffic_below_the_crossover_gives_an_honest_lower_bound() -> None:
    s = setting("H100")  # crosses near 68
    stats = synthetic(s, random.Random(1), buckets=(1, 2, 4, 8, 16, 24))
    # Traffic reached 32, but only in plain mode so far (threshold at 32, little exploration).
    stats |= synthetic(s, random.Random(2), buckets=(32,), steps={"plain": 50, "spec": 3})
    est = estimate("H100", stats)
    assert est.crossover.status == "always_pays"
    assert est.largest_batch_seen == 32
    assert "above 24, the largest batch measured in both modes" in est.reason
    assert "traffic reached 32" in est.reason
    # speculation runs through the largest bucket measured (24..31) and stops where it ends:
    # whether it pays at 32 is what a calibration under that traffic will measure
    assert est.threshold == est.bound == 32
    assert "asks for threshold 32, where the measured batches end" in est.reason


def test_speculation_that_never_pays_says_so() -> None:
    s = setting("A100", acceptance=0.0)  # every spec step commits one token per sequence
    est = estimate("A100", synthetic(s, random.Random(3), buckets=(2, 4, 8)))
    assert est.crossover.status == "never_pays"
    assert est.threshold == est.floor == 2  # off from the first bucket measured; 1 was not
    assert est.bound is None
    assert "does not pay even at batch 2" in est.reason
    assert "off from 2 up, smaller batches not measured" in est.reason
    from_one = estimate("A100", synthetic(s, random.Random(3), buckets=(1, 2, 4)))
    assert from_one.threshold == 1 and "smaller batches" not in from_one.reason  # never
    assert from_one.floor is None  # nothing smaller is left to measure


def test_the_smallest_clear_loss_marks_where_exploring_speculation_stops() -> None:
    """A100 at acceptance 0.5 crosses near batch 44: from the smallest bucket whose loss is
    clear, speculation loses at every batch up (the roofline agrees), past the crossover, so
    exploring stops where nothing is left to find. A curve that pays everywhere, or whose loss
    is within its noise, marks nothing."""
    s = setting("A100", acceptance=0.5)
    buckets = (4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
    est = estimate("A100", synthetic(s, random.Random(7), buckets=buckets))
    losing, start = est.losing, est.loses_from
    assert losing is not None and start is not None
    assert losing.speedup < 1 and clearly_not_one(losing, est.noise[losing.batch])
    assert analytic_crossover(s) <= start <= losing.batch
    assert all(s.speedup(b) < 1 for b in BATCH_BUCKETS if start <= b <= 128)
    below = [p for p in est.curve if p.batch < losing.batch]
    assert below and all(
        p.speedup >= 1 or not clearly_not_one(p, est.noise[p.batch]) for p in below
    )
    paying = estimate("H100", synthetic(setting("H100", 0.9), random.Random(7), buckets=(2, 4)))
    assert paying.crossover.status == "always_pays" and paying.loses_from is None
    close = {  # 0.97 over 20 steps a mode: within three standard errors of 1
        ("plain", 64): ModeStats(20, 20 * 70, 0.2),
        ("spec", 64): ModeStats(20, 20 * 70 * 0.97, 0.2),
    }
    assert estimate("H100", close).loses_from is None


def test_a_large_loss_turns_speculation_off_below_the_first_bucket_too() -> None:
    """A saturated fleet's window measures bucket 128 alone, where speculation loses by far
    (H100 at acceptance 0.44: the roofline crosses near batch 20). A step's time grows at most
    in proportion to its batch, so speedup s at mean batch m bounds it below 1 from m x s up:
    speculating at 96-127 once the load eased, as threshold 128 does, cost 0.86x a fixed
    threshold (examples/sim/saturated-start.yaml)."""
    s = setting("H100", acceptance=0.44)
    est = estimate("H100", synthetic(s, random.Random(5), buckets=(128,)))
    assert est.crossover.status == "never_pays"
    assert est.threshold == est.floor == est.off_from
    assert est.threshold < 128 and s.speedup(est.threshold) < 1  # the roofline agrees
    assert f"off from {est.threshold} up: the loss at 128 bounds speedup below 1" in est.reason
    assert est.agrees_with(est.threshold) and not est.agrees_with(128)
    # a loss too small to bound the batches below speaks for nothing there: 0.89 at batch 76
    # (A100, acceptance 0.7, crossing at 65) says nothing of 48-63, where it pays
    near = {
        ("plain", 64): ModeStats(400, 400 * 76, 4.0),
        ("spec", 64): ModeStats(400, 400 * 76 * 0.89, 4.0),
    }
    assert estimate("A100", near).threshold == 64


def test_speculation_never_runs_past_a_clear_loss_whatever_a_bump_above_says() -> None:
    """Speedup falls as the batch grows, so a clear loss at batch 9 rules out a gain at 13:
    the summed logs of a bumpy curve cross at 16, the threshold stops at 9. (A busy L4 fleet's
    calibration read 0.95 +/- 0.01 at batch 8, then 1.06 at 13, and asked for 18: 0.96x
    `never` over its half hour; spectune-sim.) Within its noise the same dip moves nothing."""

    def bumpy(at_8: float) -> dict[tuple[str, int], ModeStats]:
        stats = {}
        for bucket, batch, speedup in ((4, 5, 1.2), (8, 9, at_8), (12, 13, 1.12), (16, 18, 0.95)):
            stats[("plain", bucket)] = ModeStats(400, 400 * batch, 400 * 0.05)
            stats[("spec", bucket)] = ModeStats(400, 400 * batch, 400 * 0.05 / speedup)
        return stats

    clear = estimate("L4", bumpy(0.92))
    assert clear.crossover.status == "crosses" and clear.crossover.batch > 13
    assert clear.loses_from == 8 and clear.threshold == 9  # 0.92 at mean batch 9 bounds 9 up
    within = estimate("L4", bumpy(0.98))
    assert within.loses_from == 16 and within.threshold == within.crossover.threshold > 13


def test_a_move_through_a_clear_bucket_is_clear_only_the_way_it_asks() -> None:
    """A bucket that clearly loses asks for speculation off there, one that clearly pays for it
    on: only such a move skips the dead band. 66 -> 62 turns speculation off at 64-65, where it
    lost 13%; 62 -> 65 turns it back on there, which no measurement asked for."""
    stats = {}
    for bucket, batch, speedup in ((32, 40, 1.15), (48, 55, 1.05), (64, 75, 0.87)):
        stats[("plain", bucket)] = ModeStats(400, 400 * batch, 400 * 0.05)
        stats[("spec", bucket)] = ModeStats(400, 400 * batch, 400 * 0.05 / speedup)
    est = estimate("A100", stats)
    assert est.flips_a_clear_bucket(66, 62) and not est.flips_a_clear_bucket(62, 65)
    assert est.flips_a_clear_bucket(30, 40) and not est.flips_a_clear_bucket(40, 30)  # pays at 32
    assert est.flips_a_clear_bucket(None, 62) and not est.flips_a_clear_bucket(62, None)


def test_without_data_in_both_modes_the_crossover_is_unknown() -> None:
    empty = estimate("H100", {})
    assert not empty.known and empty.confidence == 0 and empty.largest_batch_seen is None
    assert empty.reason == "no decode steps in the window"
    one_mode = estimate("H100", {("spec", 8): ModeStats(500, 9000, 3.0)})
    assert not one_mode.known and one_mode.largest_batch_seen == 8
    assert f"no batch bucket has {MIN_STEPS} steps in both modes" in one_mode.reason
    with pytest.raises(ValueError):
        _ = one_mode.threshold


@pytest.mark.parametrize("fewest, confidence", [(800, 1.0), (50, 1.0), (30, 0.880), (20, 0.728)])
def test_without_measured_noise_confidence_comes_from_the_steps_around_the_crossover(
    fewest: int, confidence: float
) -> None:
    """STEP_NOISE (10%) per step in each mode where the window's batches measured nothing: the
    fewer steps in the deciding buckets, the larger the speedup's error."""
    s = setting("H100")
    stats = synthetic(s, random.Random(4), steps={"plain": 400, "spec": 400})
    est = estimate("H100", stats)
    edge = est.crossover.batch or 0
    below = max(p.batch for p in est.curve if p.batch <= edge)
    above = min(p.batch for p in est.curve if p.batch > edge)
    for key in (("spec", below), ("plain", above)):
        full = stats[key]
        stats[key] = ModeStats(
            fewest, round(full.tokens * fewest / 400), full.seconds * fewest / 400
        )
    assert estimate("H100", stats).confidence == pytest.approx(confidence, abs=0.001)


def test_measured_noise_decides_the_confidence_and_what_is_clear() -> None:
    """The window's batches measured each mode's throughput to 4% in the deciding buckets: the
    speedup to 5.7% (quadrature), a third of the confidence 400 steps a mode would assume,
    and a 7% speedup over 400 steps is no longer clear of 1."""
    s = setting("H100")
    stats = synthetic(s, random.Random(4), steps={"plain": 400, "spec": 400})
    assumed = estimate("H100", stats)
    noise = {(m, p.batch): 0.04 for m in ("spec", "plain") for p in assumed.curve}
    measured = estimate("H100", stats, throughput_noise=noise)
    assert assumed.confidence == 1.0
    assert measured.confidence == pytest.approx(CONFIDENT_SE / math.hypot(0.04, 0.04))
    assert measured.crossover == assumed.crossover  # the noise moves no estimate
    point, se = measured.noisiest or (None, 0.0)
    assert point is not None and se == pytest.approx(0.0566, abs=1e-4)
    plain = ModeStats(400, 400 * 50, 400 * 0.05)
    seven = SpeedupPoint(50, plain, ModeStats(400, round(400 * 50 * 1.07), 400 * 0.05))
    assert clearly_not_one(seven) and not clearly_not_one(seven, 0.0566)


def test_undersampled_lists_buckets_traffic_reaches_without_enough_steps_in_a_mode() -> None:
    stats = {
        ("plain", 4): ModeStats(100, 400, 1.0),
        ("spec", 4): ModeStats(25, 300, 0.4),
        ("plain", 8): ModeStats(100, 800, 1.2),
        ("spec", 8): ModeStats(5, 100, 0.1),
        ("plain", 16): ModeStats(30, 480, 0.5),
    }
    assert undersampled(stats) == [8, 16]
    assert undersampled(stats, min_steps=3) == [16]
    # a bucket with 1% of the steps waits for nothing, unless every bucket counts
    rare = stats | {("plain", 1): ModeStats(3, 3, 0.01)}
    assert undersampled(rare) == [8, 16]
    assert undersampled(rare, rare_share=0) == [1, 8, 16]


def test_compact_curve_is_bucket_to_rounded_speedup() -> None:
    est = estimate("H100", synthetic(setting("H100"), random.Random(5), buckets=(1, 2)))
    curve = est.compact_curve()
    assert set(curve) == {"1", "2"}
    assert all(isinstance(v, float) and 1 < v < 2 for v in curve.values())


def test_points_sit_at_the_mean_batch_plain_steps_measured_not_the_bucket_edge() -> None:
    # Bucket 8 ran at batch 10 on average, bucket 12 at 14 (plain: one token per sequence);
    # speedup 1.2 then 0.8 crosses halfway between the mean batches, at 12, not at 10.
    stats = {
        ("plain", 8): ModeStats(100, 1000, 1.0),
        ("spec", 8): ModeStats(100, 1200, 1.0),
        ("plain", 12): ModeStats(100, 1400, 1.0),
        ("spec", 12): ModeStats(100, 1120, 1.0),
    }
    est = estimate("H100", stats)
    assert est.crossover.batch == pytest.approx(12.0)
    assert est.threshold == 12


def test_a_speedup_of_exactly_one_is_where_it_crosses() -> None:
    stats = {
        ("plain", 4): ModeStats(100, 400, 1.0),
        ("spec", 4): ModeStats(100, 600, 1.0),
        ("plain", 6): ModeStats(100, 600, 1.0),
        ("spec", 6): ModeStats(100, 600, 1.0),
    }
    est = estimate("H100", stats)
    assert est.crossover.batch == pytest.approx(6.0)
    assert est.reason == "crossover at batch 6.0: speedup 1.50 at batch 4, 1.00 at 6"


def test_a_required_gain_puts_the_crossover_where_speedup_falls_to_it() -> None:
    """Speculation speculates only where it gains what the spec requires: 1.5 at batch 4 and
    1.0 at 6 cross 1.05 at 5.8; a curve gaining 3% at most pays by 5% at no batch; one gaining
    10% at every batch measured pays by 5% at every one."""
    stats = {
        ("plain", 4): ModeStats(100, 400, 1.0),
        ("spec", 4): ModeStats(100, 600, 1.0),
        ("plain", 6): ModeStats(100, 600, 1.0),
        ("spec", 6): ModeStats(100, 600, 1.0),
    }
    est = estimate("H100", stats, gain=0.05)
    assert est.crossover.batch == pytest.approx(5.8)
    assert est.threshold == 6
    assert est.reason == (
        "crossover at batch 5.8, where speedup falls to 1.05: speedup 1.50 at batch 4, 1.00 at 6"
    )

    def flat(speedup: float) -> StatsByBucket:
        return {
            (mode, b): ModeStats(100, round(100 * b * (speedup if mode == "spec" else 1)), 1.0)
            for b in (4, 6)
            for mode in ("plain", "spec")
        }

    assert estimate("H100", flat(1.03)).crossover.status == "always_pays"
    short = estimate("H100", flat(1.03), gain=0.05)
    assert short.crossover.status == "never_pays"
    assert short.reason.startswith("speculation does not pay by 5% or more even at batch 4")
    ample = estimate("H100", flat(1.1), gain=0.05)
    assert ample.crossover.status == "always_pays"
    assert ample.reason.startswith("speculation pays at every batch measured by 5% or more")


def test_a_speedup_is_clear_beyond_its_noise_and_the_floor() -> None:
    """7% over 20 steps a mode is 2 standard errors (10% a step) from 1: noise; over 200, 6.
    3% is under the 5% floor however many steps measured it."""

    def point(speedup: float, steps: int) -> SpeedupPoint:
        plain = ModeStats(steps, steps * 50, steps * 0.05)
        return SpeedupPoint(50, plain, ModeStats(steps, round(steps * 50 * speedup), steps * 0.05))

    assert not clearly_not_one(point(1.07, 20))
    assert clearly_not_one(point(1.07, 200)) and clearly_not_one(point(0.93, 200))
    assert not clearly_not_one(point(1.03, 100_000))


def test_the_dead_band_is_one_bucket_or_what_the_crossovers_error_spans() -> None:
    """The crossing is interpolated between the deciding buckets, so their speedups' errors
    move it, the more the flatter the curve: through 1 at 1.005 and 0.995 between 24 and 32,
    2.3% a mode (speedups to 3.3%) moves 28 by about 18, two buckets; 0.2% by 1.6, within one.
    A steep curve's crossover stays within a bucket at the same noise; one-sided curves keep 1."""

    def stats(speedups: dict[int, float]) -> dict[tuple[str, int], ModeStats]:
        out = {}
        for b, speedup in speedups.items():
            out[("plain", b)] = ModeStats(100, 100 * b, 1.0)
            out[("spec", b)] = ModeStats(100, 200 * b, 2.0 / speedup)
        return out

    def with_noise(speedups: dict[int, float], noise: float) -> Estimate:
        st = stats(speedups)
        return estimate("H100", st, throughput_noise=dict.fromkeys(st, noise))

    creeping = {16: 1.1, 24: 1.005, 32: 0.995, 48: 0.9}
    assert with_noise(creeping, 0.023).crossover.batch == pytest.approx(28.0)
    assert with_noise(creeping, 0.023).dead_band == 2
    assert with_noise(creeping, 0.002).dead_band == 1
    steep = {16: 1.3, 24: 1.1, 32: 0.9, 48: 0.7}
    assert with_noise(steep, 0.023).dead_band == 1
    assert with_noise({16: 1.3, 24: 1.2}, 0.05).dead_band == 1  # always pays


def test_noise_measured_as_exactly_zero_is_full_confidence_not_a_division_by_zero() -> None:
    """Deterministic step times (a simulated clock, a replayed sweep) measure each mode's
    throughput with no spread at all: the estimate is certain, and asking how certain must not
    raise (issue 59, I)."""
    stats: dict[tuple[str, int], ModeStats] = {}
    for b, speedup in {8: 1.3, 16: 1.1, 24: 0.9}.items():
        stats[("plain", b)] = ModeStats(100, 100 * b, 1.0)
        stats[("spec", b)] = ModeStats(100, 200 * b, 2.0 / speedup)
    exact = estimate("H100", stats, throughput_noise=dict.fromkeys(stats, 0.0))
    assert exact.crossover.status == "crosses"
    assert exact.confidence == 1.0
    assert exact.dead_band == 1
    assert all(exact.clearly(p, pays=p.speedup > 1) for p in exact.curve)
