"""The simulator's Prometheus: samples per scrape, and the reader's queries answered with
PromQL's semantics (increase() extrapolation, fresh and warm engines only)."""

from __future__ import annotations

import pytest

from spectune.engine import contract as c
from spectune.sim.scrapes import Scrapes, increase

INFO = (c.ENGINE_INFO, (("device", "NVIDIA-L4"), ("draft", "draft"), ("model", "m"),
                        ("simulated", "true"), ("version", "sim")))  # fmt: skip


def test_increase_extrapolates_to_the_window_edges_as_prometheus_does() -> None:
    # a counter growing 1/s, scraped every 15 s at 5, 20, 35, 50; window (0, 60]
    points = [(5.0, 100.0), (20.0, 115.0), (35.0, 130.0), (50.0, 145.0)]
    assert increase(points, 0.0, 60.0) == pytest.approx(60.0)
    # a series that starts at zero within the window is not extrapolated below zero
    zero = [(5.0, 0.0), (20.0, 15.0), (35.0, 30.0), (50.0, 45.0)]
    assert increase(zero, 0.0, 60.0) == pytest.approx(55.0)
    # a series first seen late: extrapolated half an interval before its first sample only
    late = [(35.0, 100.0), (50.0, 115.0)]
    assert increase(late, 0.0, 60.0) == pytest.approx(32.5)
    assert increase([(50.0, 1.0)], 0.0, 60.0) is None  # one sample: no increase


def scraped(s: Scrapes, pod: str, times: list[float], per_second: float) -> None:
    for t in times:
        s.scrape(pod, t, {INFO: 1.0, (c.REQUESTS, (("outcome", "ok"),)): t * per_second})


def test_a_read_counts_only_fresh_and_warm_engines() -> None:
    s = Scrapes(interval=15.0)
    times = [float(t) for t in range(0, 121, 15)]
    scraped(s, "old", times, 1.0)
    scraped(s, "new", [t for t in times if t >= 110], 5.0)  # one sample: not warm yet
    scraped(s, "stale", [t for t in times if t <= 60], 9.0)  # not scraped for a minute
    window = s.read(120.0, 60)
    assert set(window.engines) == {"old"}
    assert window.traffic.requests == pytest.approx(60.0)
    assert window.traffic.ok_requests == pytest.approx(60.0)
    assert s.queries > 0


def test_a_removed_pod_leaves_the_next_read() -> None:
    s = Scrapes(interval=15.0)
    scraped(s, "a", [float(t) for t in range(0, 121, 15)], 1.0)
    s.remove("a", 121.0)
    assert s.read(122.0, 60).engines == {}
