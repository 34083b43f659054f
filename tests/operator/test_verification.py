"""Verification: a goodput drop beyond noise rolls a change back and noise does not; load
changes are told apart from the threshold's effect."""

from __future__ import annotations

import dataclasses

import pytest

from spectune.engine.crossover import ModeStats
from spectune.operator.estimator import MIN_STEPS
from spectune.operator.observations import Traffic, served
from spectune.operator.verification import compare_goodput, queueing_warning, same_mix_speedup

H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB"
WINDOW = 60.0


def goodput(requests: float, met: float, abandoned: float = 0) -> Traffic:
    return Traffic(
        seconds=WINDOW,
        requests=requests + abandoned,
        slo_met=met,
        ok_requests=requests,
        rejected_requests=0,
    )


def decoded(rates: dict[int, float], steps: dict[int, int]) -> dict[str, dict[int, ModeStats]]:
    """One SKU's served steps per bucket: `steps[b]` steps of b tokens at `rates[b]` tokens/s."""
    return {H100: {b: ModeStats(n, n * b, n * b / rates[b]) for b, n in steps.items()}}


RATES = {1: 100.0, 8: 600.0, 32: 1500.0}  # a bigger batch decodes more tokens per second
SAME_MIX = decoded(RATES, {1: 100, 8: 100, 32: 100})


def test_a_goodput_drop_beyond_noise_rolls_back() -> None:
    check = compare_goodput(goodput(600, 570), goodput(600, 480), None)
    assert check.verdict == "roll_back"
    assert check.message == "SLO-met share fell from 95.0% to 80.0% (beyond noise)"


def test_a_fall_no_larger_than_the_traffic_made_before_the_change_keeps() -> None:
    """Bursty or climbing traffic moves the SLO-met share between windows whatever the
    threshold (the false roll-backs benchmarks/false_rollbacks.py counted on the trace): a fall
    within the largest move between the windows before the change is no evidence."""
    history = [goodput(600, 594), goodput(600, 540), goodput(600, 570)]  # moved by 9 points
    assert compare_goodput(goodput(600, 570), goodput(600, 528), None, history).verdict == "keep"
    beyond = compare_goodput(goodput(600, 570), goodput(600, 480), None, history)
    assert beyond.verdict == "roll_back" and "beyond the 9.0% it moved" in beyond.message


def test_requests_a_client_abandoned_are_not_judged() -> None:
    """A load generator stopping a tenth of its clients mid-request (they count as errors)
    is no SLO miss; a request refused for a full queue is one."""
    assert goodput(540, 540, abandoned=60).slo_met_share == 1.0
    assert compare_goodput(goodput(600, 600), goodput(540, 540, 60), None).verdict == "keep"
    refused = dataclasses.replace(goodput(540, 540), requests=600, rejected_requests=60)
    assert refused.slo_met_share == 0.9
    assert compare_goodput(goodput(600, 600), refused, None).verdict == "roll_back"


def test_an_slo_share_admission_already_limited_before_the_change_judges_nothing() -> None:
    """Issue 59, N: refusals or a queue before the change make the SLO-met share what admission
    let through; the change is judged by its decode alone. One whose after window refuses
    requests the before window served is judged: its memory bill may be the cause."""
    queued = dataclasses.replace(goodput(600, 570), mean_waiting=4.0, engines=2.0)
    check = compare_goodput(queued, goodput(600, 480), None)
    assert check.verdict == "unknown" and "admission" in check.message
    refusing = dataclasses.replace(goodput(600, 480), requests=700, rejected_requests=100)
    assert compare_goodput(goodput(600, 570), refusing, None).verdict == "roll_back"


def test_a_goodput_drop_within_binomial_noise_keeps() -> None:
    assert compare_goodput(goodput(600, 570), goodput(600, 560), None).verdict == "keep"
    assert compare_goodput(goodput(600, 570), goodput(600, 590), None).verdict == "keep"


def test_served_sums_both_modes_per_sku_and_bucket() -> None:
    stats = {("spec", 8): ModeStats(3, 40, 0.5), ("plain", 8): ModeStats(2, 16, 0.25)}
    assert served({H100: stats}) == {H100: {8: ModeStats(5, 56, 0.75)}}


def everywhere(sku: str, bucket: int) -> bool:
    return True


def test_decode_throughput_is_compared_on_the_same_batch_mix() -> None:
    """Load moved the batch mix from large to small batches and nothing else: the fleet-wide
    tokens per busy second fell by three quarters, the same-mix comparison sees no change."""
    busy = decoded(RATES, {1: 20, 8: 50, 32: 400})
    quiet = decoded(RATES, {1: 400, 8: 50, 32: 20})

    def fleet_rate(d: dict[str, dict[int, ModeStats]]) -> float:
        return sum(s.tokens for s in d[H100].values()) / sum(s.seconds for s in d[H100].values())

    assert fleet_rate(quiet) < 0.25 * fleet_rate(busy)
    same = same_mix_speedup(busy, quiet, everywhere)
    assert same is not None and same.speedup == pytest.approx(1.0) and same.covered == 1.0
    assert compare_goodput(goodput(600, 570), goodput(600, 570), same).verdict == "keep"


def test_a_decode_throughput_drop_on_the_same_mix_rolls_back_whatever_the_load() -> None:
    slower = decoded(RATES | {8: 0.8 * RATES[8], 32: 0.85 * RATES[32]}, {1: 100, 8: 100, 32: 100})
    same = same_mix_speedup(SAME_MIX, slower, everywhere)
    assert same is not None and 0.8 < same.speedup < 0.9
    more_load = goodput(900, 855)  # not comparable by SLO-met share, still by throughput
    check = compare_goodput(goodput(600, 570), more_load, same)
    assert check.verdict == "roll_back"
    assert (
        check.message.startswith("decode throughput on the same batch mix fell 1")
        and "in the buckets the change flipped" in check.message
    )
    a_little = decoded(RATES | {32: 0.97 * RATES[32]}, {1: 100, 8: 100, 32: 100})
    within = same_mix_speedup(SAME_MIX, a_little, everywhere)
    assert compare_goodput(goodput(600, 570), goodput(600, 570), within).verdict == "keep"


def test_only_the_buckets_the_change_flipped_judge_it() -> None:
    """A move from 8 to 32 flips buckets 8-24. The load slowed bucket 1 by half (it ran plain
    before and after: not the change's doing); the flipped bucket held: kept. The same fall in
    the flipped bucket rolls back."""
    eight_to_32 = {H100: (8, 32)}

    def flipped(sku: str, bucket: int) -> bool:
        low, high = eight_to_32[sku]
        return low <= bucket < high

    slow_1 = decoded(RATES | {1: 0.5 * RATES[1]}, {1: 100, 8: 100, 32: 100})
    held = same_mix_speedup(SAME_MIX, slow_1, flipped)
    assert held is not None and held.speedup == pytest.approx(1.0) and held.covered == 1.0
    assert compare_goodput(goodput(600, 570), goodput(600, 570), held).verdict == "keep"
    slow_8 = decoded(RATES | {8: 0.5 * RATES[8]}, {1: 100, 8: 100, 32: 100})
    fell = same_mix_speedup(SAME_MIX, slow_8, flipped)
    assert fell is not None and fell.speedup == pytest.approx(0.5)
    assert compare_goodput(goodput(600, 570), goodput(600, 570), fell).verdict == "roll_back"


def test_a_move_among_batches_the_traffic_does_not_make_keeps_unless_the_slo_share_fell() -> None:
    """A few clients make batches of 1-3; a move from 8 to 4 flips buckets 4-7, where no step
    ran since: each ran the mode it ran before, so decode cannot have suffered (the demo's
    first calibration, with too few requests for the SLO-met share to decide). The SLO-met
    share still judges; a window that decoded nothing is no evidence."""
    above_32 = lambda sku, bucket: bucket > 32  # noqa: E731
    slow_1 = decoded(RATES | {1: 0.5 * RATES[1]}, {1: 100, 8: 100, 32: 100})
    untouched = same_mix_speedup(SAME_MIX, slow_1, above_32)
    assert untouched is not None and untouched.untouched and untouched.speedup == 1.0
    kept = compare_goodput(goodput(20, 19), goodput(20, 19), untouched)
    assert kept.verdict == "keep" and "no batch since ran in a bucket" in kept.message
    fell = compare_goodput(goodput(600, 570), goodput(600, 480), untouched)
    assert fell.verdict == "roll_back" and "SLO-met share fell" in fell.message
    assert same_mix_speedup(SAME_MIX, decoded(RATES, {1: 0, 8: 0}), above_32) is None
    only_32 = lambda sku, bucket: bucket == 32  # noqa: E731
    assert same_mix_speedup(decoded(RATES, {1: 100}), SAME_MIX, only_32) is None  # ran, unmeasured


def test_the_margin_follows_the_noise_of_the_buckets_that_did_not_flip() -> None:
    """Buckets that ran the same mode before and after move by noise alone: the more they
    move per step, the larger the fall a flipped bucket must show. With fewer than two of
    them, the margin is the 5% floor."""
    steps = {1: 100, 2: 100, 4: 100, 8: 100}
    rates = {1: 100.0, 2: 180.0, 4: 320.0, 8: 600.0}
    calm, noisy = dict(rates), rates | {1: 120.0, 2: 150.0, 4: 380.0}
    only_8 = lambda sku, bucket: bucket == 8  # noqa: E731
    quiet = same_mix_speedup(decoded(rates, steps), decoded(calm, steps), only_8)
    loud = same_mix_speedup(decoded(rates, steps), decoded(noisy, steps), only_8)
    assert quiet is not None and loud is not None
    assert quiet.margin == 0.05 and loud.margin > 0.3
    lone = same_mix_speedup(SAME_MIX, decoded(RATES | {1: 130.0}, {1: 100, 8: 100, 32: 100}),
                            lambda sku, bucket: bucket >= 8)  # fmt: skip
    assert lone is not None and lone.margin == 0.05  # one bucket to learn from: the floor
    before = decoded(rates, steps)
    slower = same_mix_speedup(before, decoded(rates | {8: 450.0}, steps), only_8)
    assert compare_goodput(goodput(600, 570), goodput(600, 570), slower).verdict == "roll_back"
    within = same_mix_speedup(before, decoded(noisy | {8: 450.0}, steps), only_8)
    assert compare_goodput(goodput(600, 570), goodput(600, 570), within).verdict == "keep"


def test_only_buckets_measured_in_both_windows_compare() -> None:
    few = decoded(RATES, {1: 100, 8: 100, 32: MIN_STEPS - 1})
    slow_32 = decoded(RATES | {32: 0.5 * RATES[32]}, {1: 100, 8: 100, 32: 100})
    same = same_mix_speedup(few, slow_32, everywhere)  # 32: too few steps before the change
    assert same is not None and same.speedup == pytest.approx(1.0) and same.covered < 0.5
    assert compare_goodput(Traffic(WINDOW), Traffic(WINDOW), same).verdict == "unknown"
    assert same_mix_speedup({"NVIDIA-L4": SAME_MIX[H100]}, SAME_MIX, everywhere) is None
    assert same_mix_speedup({}, SAME_MIX, everywhere) is None


def test_incomparable_windows_are_unknown() -> None:
    assert compare_goodput(goodput(600, 570), goodput(900, 500), None).verdict == "unknown"
    assert compare_goodput(goodput(20, 19), goodput(20, 5), None).verdict == "unknown"
    assert compare_goodput(Traffic(WINDOW), goodput(600, 500), None).verdict == "unknown"
    no_measure = Traffic(WINDOW, requests=600)
    assert compare_goodput(no_measure, goodput(600, 500), None).verdict == "unknown"


def latency(admitted: float, p95: float, itl_ms: float) -> Traffic:
    return Traffic(
        seconds=WINDOW, admitted_concurrency=admitted, e2e_p95_seconds=p95,
        inter_token_seconds=itl_ms / 1000 * 5000, inter_tokens=5000,
    )  # fmt: skip


def test_queueing_from_speculations_memory_is_named_only_when_all_three_signals_agree() -> None:
    before = latency(admitted=64, p95=4.0, itl_ms=40)
    warning = queueing_warning(before, latency(admitted=40, p95=6.0, itl_ms=25))
    assert warning is not None
    assert "64 to 40" in warning and "4.00 s to 6.00 s" in warning and "40 -> 25 ms" in warning
    for after in (
        latency(admitted=62, p95=6.0, itl_ms=25),  # concurrency within the tolerance
        latency(admitted=40, p95=4.2, itl_ms=25),  # latency within it
        latency(admitted=40, p95=6.0, itl_ms=45),  # tokens slower too: not speculation's bill
        Traffic(seconds=WINDOW),  # unknown is not evidence
    ):
        assert queueing_warning(before, after) is None, after


def test_a_change_that_only_turns_speculation_off_is_judged_by_decode_where_it_compared() -> None:
    """Turning speculation off frees the draft's KV memory, so the SLO-met share can fall only
    through the flipped buckets' decode rate, which the same-mix measure reads: where that
    compared and held, a fall in the share is the load's (a busy L4 fleet's share swung from
    97.6% to 87.0% with its trace and rolled back 7 of 24 moves from 8 down that decoded
    1.2-1.4x faster where they flipped; spectune-sim). Without a comparable decode, or for a
    change that speculates more, the share still judges."""
    only_8 = lambda sku, bucket: bucket == 8  # noqa: E731
    steps = {1: 100, 8: 100, 32: 100}
    faster = same_mix_speedup(SAME_MIX, decoded(RATES | {8: 1.3 * RATES[8]}, steps), only_8)
    assert faster is not None and faster.speedup == pytest.approx(1.3)
    before, after = goodput(600, 570), goodput(600, 480)
    assert compare_goodput(before, after, faster).verdict == "roll_back"
    kept = compare_goodput(before, after, faster, speculates_less=True)
    assert kept.verdict == "keep" and "x1.30 where it flipped" in kept.message
    blind = compare_goodput(before, after, None, speculates_less=True)
    assert blind.verdict == "roll_back" and "SLO-met share fell" in blind.message
