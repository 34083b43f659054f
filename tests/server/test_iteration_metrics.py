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


def test_every_series_carries_exactly_the_labels_the_contract_names() -> None:
    """The reader keys a pod's series by the contract's labels alone (a pod scraped by two
    jobs counts once): a label the engine adds and the contract lacks would make it collapse
    series that differ, one it names and the engine lacks would not group."""
    metrics = EngineMetrics(INFO)
    metrics.observe_iteration(Iteration("spec", 4, 8, 0.010, draft_seconds=0.002, explored=True))
    metrics.observe_iteration(Iteration("plain", 20, 20, 0.008))
    metrics.observe_request(None, "ok", slo_met=False, prompt_tokens=5)
    metrics.observe_tokens(0.02, 2)
    samples = parse(generate_latest(metrics.registry).decode())
    names = {name for name, _ in samples}
    assert {contract.STEP_SECONDS + "_bucket", contract.ITERATIONS, contract.REQUESTS} <= names
    for name, labels in samples:
        want = set(INFO) if name == contract.ENGINE_INFO else set(contract.own_labels(name))
        assert {k for k, _ in labels} == want, name
