"""What the step metrics export for each iteration: steady-state step time, the draft's
catch-up apart, and iterations by mode and by explored or not."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from spectune.engine import contract
from spectune.engine.engine import Iteration
from spectune.engine.serving.metrics import EngineMetrics

from .metrics_text import parse, total

INFO = {"device": "cpu", "model": "m", "draft": "d", "version": "0"}


def test_iterations_count_by_mode_and_exploration_and_catch_up_stays_apart() -> None:
    metrics = EngineMetrics(INFO)
    runs = [
        Iteration("spec", 4, 8, 0.010, draft_seconds=0.002, catchup_seconds=0.005, explored=True),
        # The draft's prefill is inside `seconds` already: STEP_SECONDS adds nothing for it.
        Iteration("spec", 4, 8, 0.010, draft_seconds=0.002, draft_prefill_seconds=0.003),
        Iteration("plain", 4, 4, 0.006),
        Iteration("plain", 4, 4, 0.006, explored=True),
        Iteration("plain", 20, 20, 0.008, explored=True),
        Iteration("prefill", 4, 4, 0.050),
    ]
    for it in runs:
        metrics.observe_iteration(it)
    samples = parse(generate_latest(metrics.registry).decode())
    counts = {
        (mode, explored): total(samples, contract.ITERATIONS, mode=mode, explored=explored)
        for mode in contract.MODES
        for explored in ("true", "false")
    }
    assert counts == {
        ("spec", "true"): 1,
        ("spec", "false"): 1,
        ("plain", "true"): 2,
        ("plain", "false"): 1,
    }
    assert total(samples, contract.STEP_SECONDS + "_sum", mode="spec") == pytest.approx(0.020)
    assert total(samples, contract.DRAFT_CATCHUP_SECONDS, batch="4") == 0.005
    assert total(samples, contract.DRAFT_PREFILL_SECONDS, batch="4") == 0.003
