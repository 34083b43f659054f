"""Reading OpenAI streams and spectune's /metrics page."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from spectune.engine.bench.loadgen import Finished, Output, RequestFailed
from spectune.engine.bench.targets import _events, parse_counters
from spectune.engine.engine import Iteration
from spectune.engine.serving.metrics import EngineMetrics

INFO = {"device": "cpu", "model": "m", "draft": "d", "version": "0"}


def test_stream_events() -> None:
    assert _events('data: {"choices": [{"text": "ab", "index": 0}]}') == [Output()]
    assert _events('data: {"choices": [{"text": ""}]}') == []
    usage = 'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9}}'
    assert _events(usage) == [Finished(9)]
    assert _events("data: [DONE]") == [] and _events(": keep-alive") == [] and _events("") == []
    with pytest.raises(RequestFailed, match="reported: overloaded"):
        _events('data: {"error": {"message": "overloaded"}}')
    with pytest.raises(RequestFailed, match="not JSON"):
        _events("data: {oops")


def test_counters_from_the_metric_contract() -> None:
    metrics = EngineMetrics(INFO)
    metrics.observe_iteration(Iteration("prefill", 3, 3, 0.5))
    metrics.observe_iteration(Iteration("plain", 3, 3, 0.01))
    metrics.observe_iteration(Iteration("plain", 2, 2, 0.01))
    metrics.observe_iteration(Iteration("spec", 5, 14, 0.04, 0.01, False, 5, 20, 9))
    metrics.count_overruns(2)
    counters = parse_counters(generate_latest(metrics.registry).decode())
    assert counters is not None
    assert {k: (v.steps, v.tokens) for k, v in counters.steps.items()} == {
        ("plain", 3): (1, 3),
        ("plain", 2): (1, 2),
        ("spec", 4): (1, 14),
    }
    assert counters.steps[("spec", 4)].seconds == pytest.approx(0.04)
    assert (counters.drafted, counters.accepted, counters.decode_steps) == (20, 9, 3)
    assert counters.overruns == 2
    assert counters.mean_batch == pytest.approx(3.0)  # bucket floors 3, 2, 4


def test_a_page_without_spectune_metrics_gives_none() -> None:
    assert parse_counters("# TYPE up gauge\nup 1\n") is None
