"""Change detection and damping: each trigger fires on its change with a readable reason and
stays quiet on no change, unknown data and noise; the threshold never flaps; a goodput drop
beyond noise rolls a change back and noise does not."""

from __future__ import annotations

import dataclasses
import itertools
import random
from datetime import UTC, datetime, timedelta

import pytest

from spectune.engine.crossover import ModeStats
from spectune.operator.estimator import MIN_STEPS
from spectune.operator.models import parse_spec
from spectune.operator.triggers import (
    SpecKey,
    Traffic,
    bucket_steps,
    clamp,
    compare_goodput,
    damp,
    queueing_warning,
    replicas_changed,
    same_mix_speedup,
    served,
    skus_changed,
    spec_changed,
    too_old,
    traffic_shifted,
)

H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB"
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
WINDOW = 60.0


def traffic(
    rate: float = 10.0, tokens: float = 100.0, acceptance: float = 0.6, prompt: float = 64.0
) -> Traffic:
    requests = rate * WINDOW
    return Traffic(
        seconds=WINDOW,
        requests=requests,
        ok_requests=requests,
        prompt_tokens=requests * prompt,
        decode_tokens=requests * tokens,
        drafted_tokens=1000.0,
        accepted_tokens=1000.0 * acceptance,
    )


def test_replicas() -> None:
    assert replicas_changed(2, 2) is None
    reason = replicas_changed(2, 3)
    assert reason is not None and reason.kind == "Replicas"
    assert reason.message == "replicas changed from 2 to 3"


def test_skus_name_both_sets_and_an_unknown_set_is_no_change() -> None:
    assert skus_changed(frozenset({H100}), frozenset({H100})) is None
    assert skus_changed(frozenset({H100}), frozenset()) is None  # pods not placed yet
    assert skus_changed(frozenset(), frozenset({H100})) is None  # nothing measured before
    reason = skus_changed(frozenset({H100}), frozenset({A100, H100}))
    assert reason is not None and reason.kind == "Sku"
    assert reason.message == f"GPU SKUs changed from {H100} to {A100}, {H100}"


def test_spec_changes_of_model_draft_method_or_k_and_not_of_the_threshold() -> None:
    base = {"model": {"name": "tiny-target"}, "speculation": {"method": "ngram"}}
    before = SpecKey.of(parse_spec(base))
    pinned = base | {
        "speculation": {"method": "ngram", "threshold": {"mode": "Manual", "value": 8}},
        "replicas": 5,
    }
    assert spec_changed(before, SpecKey.of(parse_spec(pinned))) is None
    drafted = base | {
        "speculation": {"method": "draft", "draft": "tiny-draft", "numSpeculativeTokens": 2}
    }
    reason = spec_changed(before, SpecKey.of(parse_spec(drafted)))
    assert reason is not None and reason.kind == "Spec"
    assert (
        reason.message == "spec changed: draft None -> tiny-draft, method ngram -> draft, k 4 -> 2"
    )
    other_model = base | {"model": {"name": "other"}}
    reason = spec_changed(before, SpecKey.of(parse_spec(other_model)))
    assert reason is not None and "model tiny-target -> other" in reason.message


def test_max_age() -> None:
    hour = timedelta(hours=1)
    assert too_old(T0, T0 + timedelta(minutes=59), hour) is None
    reason = too_old(T0, T0 + timedelta(minutes=61, seconds=5), hour)
    assert reason is not None and reason.kind == "MaxAge"
    assert reason.message == "last measured 1h01m ago (maximum age 1h00m)"


def test_noise_within_the_percent_never_fires() -> None:
    rng = random.Random(0)
    base = traffic()
    history = []
    for _ in range(500):  # every signal wanders up to 25% either way; the percent is 30
        history.append(
            traffic(
                10 * rng.uniform(0.75, 1.25),
                100 * rng.uniform(0.75, 1.25),
                0.6 * rng.uniform(0.75, 1.25),
                64 * rng.uniform(0.75, 1.25),
            )
        )
        assert traffic_shifted(base, history, percent=30) is None


@pytest.mark.parametrize(
    "shifted, signal",
    [
        (traffic(rate=14), "request rate"),
        (traffic(rate=6), "request rate"),
        (traffic(tokens=200), "output tokens per request"),
        (traffic(prompt=512), "prompt tokens per request"),
        (traffic(acceptance=0.3), "acceptance rate"),
    ],
)
def test_a_shift_held_for_the_windows_fires_naming_the_signal(
    shifted: Traffic, signal: str
) -> None:
    base = traffic()
    assert traffic_shifted(base, [base, shifted, shifted], percent=30) is None  # 2 of 3
    reason = traffic_shifted(base, [base, shifted, shifted, shifted], percent=30)
    assert reason is not None and reason.kind == "Traffic"
    assert reason.message.startswith(signal) and "over 3 windows" in reason.message
    assert "30% trafficChangePercent" in reason.message


def test_every_signal_that_moved_is_named() -> None:
    base, longer = traffic(), traffic(rate=5, prompt=512)
    reason = traffic_shifted(base, [longer] * 3, percent=30)
    assert reason is not None
    assert reason.message.startswith("request rate moved by at least -50% (10 -> 5); ")
    assert "prompt tokens per request moved by at least +700% (64 -> 512) over 3" in reason.message
    assert "acceptance" not in reason.message and "output" not in reason.message


def test_a_spike_or_a_shift_that_flips_direction_does_not_fire() -> None:
    base = traffic()
    spike = [traffic(), traffic(rate=30), traffic()]
    assert traffic_shifted(base, spike, percent=30, windows=3) is None
    flip = [traffic(rate=15), traffic(rate=5), traffic(rate=15)]
    assert traffic_shifted(base, flip, percent=30) is None


def test_unknown_traffic_never_fires() -> None:
    base = traffic()
    unknown = Traffic(seconds=WINDOW)
    assert traffic_shifted(base, [traffic(rate=20), unknown, traffic(rate=20)], 30) is None
    assert traffic_shifted(unknown, [traffic(rate=20)] * 3, 30) is None
    assert unknown.request_rate is None and unknown.acceptance is None
    no_drafts = Traffic(seconds=WINDOW, drafted_tokens=0.0, accepted_tokens=0.0)
    assert no_drafts.acceptance is None  # nothing drafted: unknown, not 0% acceptance


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


def test_a_move_before_the_minimum_dwell_holds_and_says_how_long() -> None:
    d = damp(16, 64, 1, 256, last_change=T0 - timedelta(minutes=2), now=T0, min_dwell=DWELL)
    assert (d.action, d.threshold) == ("hold", 16)
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


def test_requests_a_client_abandoned_are_not_judged() -> None:
    """A load generator stopping a tenth of its clients mid-request (they count as errors)
    is no SLO miss; a request refused for a full queue is one."""
    assert goodput(540, 540, abandoned=60).slo_met_share == 1.0
    assert compare_goodput(goodput(600, 600), goodput(540, 540, 60), None).verdict == "keep"
    refused = dataclasses.replace(goodput(540, 540), requests=600, rejected_requests=60)
    assert refused.slo_met_share == 0.9
    assert compare_goodput(goodput(600, 600), refused, None).verdict == "roll_back"


def test_a_goodput_drop_within_binomial_noise_keeps() -> None:
    assert compare_goodput(goodput(600, 570), goodput(600, 560), None).verdict == "keep"
    assert compare_goodput(goodput(600, 570), goodput(600, 590), None).verdict == "keep"


def test_served_sums_both_modes_per_sku_and_bucket() -> None:
    stats = {("spec", 8): ModeStats(3, 40, 0.5), ("plain", 8): ModeStats(2, 16, 0.25)}
    assert served({H100: stats}) == {H100: {8: ModeStats(5, 56, 0.75)}}


def test_decode_throughput_is_compared_on_the_same_batch_mix() -> None:
    """Load moved the batch mix from large to small batches and nothing else: the fleet-wide
    tokens per busy second fell by three quarters, the same-mix comparison sees no change."""
    busy = decoded(RATES, {1: 20, 8: 50, 32: 400})
    quiet = decoded(RATES, {1: 400, 8: 50, 32: 20})

    def fleet_rate(d: dict[str, dict[int, ModeStats]]) -> float:
        return sum(s.tokens for s in d[H100].values()) / sum(s.seconds for s in d[H100].values())

    assert fleet_rate(quiet) < 0.25 * fleet_rate(busy)
    same = same_mix_speedup(busy, quiet)
    assert same is not None and same.speedup == pytest.approx(1.0) and same.covered == 1.0
    assert compare_goodput(goodput(600, 570), goodput(600, 570), same).verdict == "keep"


def test_a_decode_throughput_drop_on_the_same_mix_rolls_back_whatever_the_load() -> None:
    slower = decoded(RATES | {8: 0.8 * RATES[8], 32: 0.85 * RATES[32]}, {1: 100, 8: 100, 32: 100})
    same = same_mix_speedup(SAME_MIX, slower)
    assert same is not None and 0.8 < same.speedup < 0.9
    more_load = goodput(900, 855)  # not comparable by SLO-met share, still by throughput
    check = compare_goodput(goodput(600, 570), more_load, same)
    assert check.verdict == "roll_back"
    assert check.message.startswith("decode throughput on the same batch mix fell 1")
    a_little = decoded(RATES | {32: 0.97 * RATES[32]}, {1: 100, 8: 100, 32: 100})
    within = same_mix_speedup(SAME_MIX, a_little)
    assert compare_goodput(goodput(600, 570), goodput(600, 570), within).verdict == "keep"


def test_only_buckets_measured_in_both_windows_compare() -> None:
    few = decoded(RATES, {1: 100, 8: 100, 32: MIN_STEPS - 1})
    slow_32 = decoded(RATES | {32: 0.5 * RATES[32]}, {1: 100, 8: 100, 32: 100})
    same = same_mix_speedup(few, slow_32)  # bucket 32: too few steps before the change
    assert same is not None and same.speedup == pytest.approx(1.0) and same.covered < 0.5
    assert compare_goodput(Traffic(WINDOW), Traffic(WINDOW), same).verdict == "unknown"
    assert same_mix_speedup({"NVIDIA-L4": SAME_MIX[H100]}, SAME_MIX) is None  # another SKU
    assert same_mix_speedup({}, SAME_MIX) is None


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
