"""The operator's memory between turns: traffic windows are consecutive and bounded."""

from __future__ import annotations

from datetime import timedelta

from spectune.operator.fleet_memory import record_window

from .machine import T0, traffic


def test_traffic_windows_are_consecutive_and_bounded() -> None:
    w: list = []
    for i in range(10):
        w = record_window(w, T0 + timedelta(seconds=10 * i), traffic(rate=i))
    assert [t.request_rate for _, t in w] == [0.0, 6.0]  # 60 s apart: 0, 60 (and 120 pending)
    for i in range(10, 30):
        w = record_window(w, T0 + timedelta(seconds=10 * i), traffic(rate=i))
    assert [t.request_rate for _, t in w] == [12.0, 18.0, 24.0]
