"""fleet_window: the answers to one read's figures turned into what the state machine decides
on, whoever answered them (Prometheus for the reader, the fleet simulator's samples)."""

from __future__ import annotations

import pytest

from spectune.engine.crossover import ModeStats
from spectune.operator.observations import EngineInfo
from spectune.operator.window import (
    Answers,
    bucket_quantile,
    fleet_window,
    freshness,
    steady_prefill_excess,
    throughput_noise,
)


def info(pod: str, device: str) -> EngineInfo:
    return EngineInfo(pod, device, "m", "d", "v", True, 1.0)


def test_steps_are_per_sku_and_unknown_figures_are_none_not_zero() -> None:
    pods = {"a": info("a", "L4"), "b": info("b", "H100")}
    answers: Answers = {
        "steps": {("L4", "spec", "8"): 15, ("H100", "plain", "8"): 4, ("L4", "spec", "x"): 9},
        "step_seconds": {("L4", "spec", "8"): 0.3, ("H100", "plain", "8"): 0.1},
        "step_tokens": {("L4", "spec", "8"): 290, ("H100", "plain", "8"): 4},
        "requests": {("ok",): 8, ("rejected",): 1, ("error",): 1},
        "running": {(): 2.0},
        "e2e_p95": {(): float("nan")},  # histogram_quantile without observations
    }
    window = fleet_window(pods, 60, answers)
    assert window.steps == {
        "L4": {("spec", 8): ModeStats(15, 290, pytest.approx(0.3))},
        "H100": {("plain", 8): ModeStats(4, 4, pytest.approx(0.1))},
    }
    t = window.traffic
    assert t.requests == 10 and t.ok_requests == 8 and t.rejected_requests == 1
    assert t.mean_running == 2.0 and t.engines == 2.0
    assert t.slo_met is None and t.admitted_concurrency is None  # no answer: unknown
    assert t.e2e_p95_seconds is None
    assert t.decode_tokens == 294


def test_throughput_noise_is_the_batch_means_error_of_the_ratio() -> None:
    """Each batch (one scrape interval) weighs by its seconds; the error is of the summed
    throughput, relative to it. Batches that ran nothing do not count; too few say nothing."""
    steady = [(100.0, 1.0)] * 4
    assert throughput_noise(steady) == 0.0
    swinging = [(110.0, 1.0), (90.0, 1.0), (110.0, 1.0), (90.0, 1.0), (0.0, 0.0)]
    # rate 100; residuals 10 each: sqrt(4/3 * 400) / 400 tokens
    assert throughput_noise(swinging) == pytest.approx((4 / 3 * 400) ** 0.5 / 400)
    assert throughput_noise(swinging[:3]) is None
    # a long batch at one rate and short ones at another: weighed by seconds, not counted alike
    long_short = [(1000.0, 10.0), (50.0, 1.0), (50.0, 1.0), (50.0, 1.0)]
    even = [(1000.0, 10.0), (500.0, 10.0), (500.0, 10.0), (500.0, 10.0)]
    assert throughput_noise(long_short) < throughput_noise(even)


def test_the_window_carries_the_noise_of_each_sku_mode_and_bucket() -> None:
    batches = {
        ("L4", "spec", "8"): [(110.0, 1.0), (90.0, 1.0)] * 2,
        ("L4", "plain", "8"): [(100.0, 1.0)] * 3,  # too few batches: no noise measured
        ("L4", "spec", "x"): [(1.0, 1.0)] * 4,
    }
    window = fleet_window({"a": info("a", "L4")}, 60, {}, 2.0, batches)
    assert window.noise == {"L4": {("spec", 8): pytest.approx(0.0577, abs=1e-4)}}


def test_bucket_quantile_interpolates_as_histogram_quantile_does() -> None:
    buckets = {"0.1": 10.0, "0.5": 50.0, "1": 90.0, "+Inf": 100.0}
    assert bucket_quantile(0.2, buckets) == pytest.approx(0.2)  # 0.1 + 0.4 * 10/40
    assert bucket_quantile(0.5, buckets) == pytest.approx(0.5)
    assert bucket_quantile(0.05, buckets) == pytest.approx(0.05)  # from 0 within the first
    assert bucket_quantile(0.95, buckets) == 1.0  # in +Inf: the largest finite bound
    assert bucket_quantile(0.95, {"0.1": 0.0, "+Inf": 0.0}) is None
    assert bucket_quantile(0.95, {}) is None


def test_spec_steps_keep_only_their_steady_share_of_the_draft_prefill() -> None:
    """Half the bucket's tokens came from plain steps: half the prefill the spec steps paid
    belongs to the tokens those steps made, and is taken off the spec steps' time."""
    answers: Answers = {
        "steps": {("L4", "spec", "8"): 10, ("L4", "plain", "8"): 10},
        "step_seconds": {("L4", "spec", "8"): 1.0, ("L4", "plain", "8"): 0.5},
        "step_tokens": {("L4", "spec", "8"): 100, ("L4", "plain", "8"): 100},
        "prefill_seconds": {("L4", "8"): 0.2},
    }
    steps = fleet_window({"a": info("a", "L4")}, 60, answers).steps["L4"]
    assert steps[("spec", 8)].seconds == pytest.approx(0.9)  # 1.0 - 0.2 x 100/200
    assert steps[("plain", 8)].seconds == pytest.approx(0.5)
    assert steady_prefill_excess(0.2, 100, 0) == 0.0  # speculating throughout: all of it stays


@pytest.mark.parametrize(
    ("interval", "expected"),
    [(None, (30.0, 15.0)), (2.0, (30.0, 15.0)), (15.0, (45.0, 30.0)), (60.0, (180.0, 120.0))],
)
def test_staleness_and_warm_up_stretch_to_the_scrape_interval(
    interval: float | None, expected: tuple[float, float]
) -> None:
    """At fast scrapes the configured 30 s / 15 s hold; at slow ones a series is fresh for three
    intervals and warm after two (a counter's two samples)."""
    assert freshness(30.0, 15.0, interval) == expected
    assert freshness(30.0, 0.0, interval)[1] == 0.0  # no warm-up asked: none added


def test_a_non_finite_sample_is_a_missing_sample_not_a_crash() -> None:
    """NaN or Inf in any series (a recording rule's division, a counter gone wrong) reads as no
    answer for that series: the window is built, the figure unknown (issue 59, H). Before, a NaN
    step count raised in round() and crashed every turn."""
    nan, inf = float("nan"), float("inf")
    answers: Answers = {
        "steps": {("L4", "spec", "8"): nan, ("L4", "plain", "8"): 20},
        "step_seconds": {("L4", "spec", "8"): 0.3, ("L4", "plain", "8"): inf},
        "step_tokens": {("L4", "spec", "8"): 290, ("L4", "plain", "8"): 20},
        "requests": {("ok",): inf},
        "running": {(): -inf},
    }
    batches = {("L4", "spec", "8"): [(110.0, 1.0), (nan, 1.0), (90.0, inf), (100.0, 1.0)]}
    window = fleet_window({"a": info("a", "L4")}, 60, answers, 2.0, batches)
    assert window.steps == {"L4": {("plain", 8): ModeStats(20, 20, 0.0)}}
    assert window.traffic.requests is None and window.traffic.mean_running is None
    assert window.noise == {}  # two finite batches are too few to measure it
