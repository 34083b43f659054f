"""The operator's memory between turns: a pod's SKU outlives a missed scrape, traffic windows
are consecutive and bounded."""

from __future__ import annotations

from datetime import timedelta

from spectune.operator.fleet_memory import pod_skus, record_window

from .machine import H100, L4, T0, traffic, window


def test_a_pods_sku_outlives_a_missed_scrape_but_not_the_pod() -> None:
    known = pod_skus({}, window(pods={"e-0": H100, "e-1": L4}), ["e-0", "e-1"])
    assert known == {"e-0": H100, "e-1": L4}
    # e-1 stale in this window (a late scrape): still an L4, not the deployment's threshold
    known = pod_skus(known, window(pods={"e-0": H100}), ["e-0", "e-1", "e-2"])
    assert known == {"e-0": H100, "e-1": L4}
    assert pod_skus(known, None, ["e-1"]) == {"e-1": L4}  # Prometheus down: the same
    assert pod_skus(known, window(pods={"e-2": H100}), ["e-2"]) == {"e-2": H100}  # gone: forgotten


def test_traffic_windows_are_consecutive_and_bounded() -> None:
    w: list = []
    for i in range(10):
        w = record_window(w, T0 + timedelta(seconds=10 * i), traffic(rate=i))
    assert [t.request_rate for _, t in w] == [0.0, 6.0]  # 60 s apart: 0, 60 (and 120 pending)
    for i in range(10, 30):
        w = record_window(w, T0 + timedelta(seconds=10 * i), traffic(rate=i))
    assert [t.request_rate for _, t in w] == [12.0, 18.0, 24.0]
