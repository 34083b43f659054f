"""fleet_window: per-pod series summed into what the state machine decides on, whoever
answered the queries (the Prometheus reader or the fleet simulator)."""

from __future__ import annotations

import pytest

from spectune.engine import contract as c
from spectune.engine.crossover import ModeStats
from spectune.operator.observations import EngineInfo
from spectune.operator.window import (
    PerPod,
    bucket_quantile,
    fleet_window,
    freshness,
    steady_prefill_excess,
)


def info(pod: str, device: str) -> EngineInfo:
    return EngineInfo(pod, device, "m", "d", "v", True, 1.0)


SERIES: dict[str, PerPod] = {
    f"{c.STEP_SECONDS}_count": {("spec", "8"): {"a": 10, "b": 5, "gone": 99}},
    f"{c.STEP_SECONDS}_sum": {("spec", "8"): {"a": 0.1, "b": 0.2, "gone": 9.0}},
    c.STEP_OUTPUT_TOKENS: {("spec", "8"): {"a": 200, "b": 90, "gone": 999}},
    c.REQUESTS: {(): {"a": 4, "b": 6, "gone": 100}},
}


def increase(metric: str, by: tuple[str, ...] = (), **labels: str) -> PerPod:
    if labels == {"outcome": "ok"} and metric == c.REQUESTS:
        return {(): {"a": 3, "b": 5}}
    return SERIES.get(metric, {})


def test_steps_are_summed_per_sku_and_pods_not_fresh_lend_nothing() -> None:
    pods = {"a": info("a", "L4"), "b": info("b", "L4")}
    window = fleet_window(pods, 60, increase, lambda metric: {"a": 2.0, "gone": 50.0})
    assert window.steps == {"L4": {("spec", 8): ModeStats(15, 290, pytest.approx(0.3))}}
    assert window.traffic.requests == 10 and window.traffic.ok_requests == 8
    assert window.traffic.mean_running == 2.0  # the stale pod's gauge is left out
    assert window.traffic.slo_met is None  # no series: unknown, not zero
    assert window.traffic.decode_tokens == 290


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
    series: dict[str, PerPod] = {
        f"{c.STEP_SECONDS}_count": {("spec", "8"): {"a": 10}, ("plain", "8"): {"a": 10}},
        f"{c.STEP_SECONDS}_sum": {("spec", "8"): {"a": 1.0}, ("plain", "8"): {"a": 0.5}},
        c.STEP_OUTPUT_TOKENS: {("spec", "8"): {"a": 100}, ("plain", "8"): {"a": 100}},
        c.DRAFT_PREFILL_SECONDS: {("8",): {"a": 0.2}},
    }

    def inc(metric: str, by: tuple[str, ...] = (), **labels: str) -> PerPod:
        return series.get(metric, {})

    steps = fleet_window({"a": info("a", "L4")}, 60, inc, lambda m: {}).steps["L4"]
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
