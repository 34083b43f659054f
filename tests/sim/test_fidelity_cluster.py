"""benchmarks/sim_fidelity_cluster.py compares the simulator's running batch with an engine
pod's, which it reads from the pod's /metrics: decode steps per batch bucket, and their mean
exactly, as the steps' output tokens less the accepted drafted tokens. Here that reading is
checked against the engine's own iterations: the in-process engine (tiny pair, simulated L4,
speculating with plain steps explored, so that both modes and paused sequences appear) records
each iteration in the server's metrics, whose text the benchmark parses as it parses a pod's.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from spectune.engine import contract as c
from spectune.engine.config import EngineConfig
from spectune.engine.engine import LLMEngine
from spectune.engine.gate import GateSettings
from spectune.engine.sequence import SamplingParams
from spectune.engine.serving.metrics import EngineMetrics
from spectune.engine.zoo.registry import resolve_model
from tests.cluster.support import REPO, load_script


def test_the_running_batch_read_from_metrics_is_the_engines(
    tiny_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # its sibling scripts
    bench = load_script("sim_fidelity_cluster", "benchmarks")
    jobs = sys.modules["sim_fidelity"].workload(12, 0, (16, 96), (8, 40))
    config = EngineConfig(
        model="tiny-target", draft="tiny-draft", k=4, device="cpu", max_batch_size=8,
        gate=GateSettings(threshold=None, exploration=0.3), simulate_device="L4",
    )  # fmt: skip
    engine = LLMEngine(config, resolve_model=resolve_model)
    assert engine.simulation is not None
    engine.simulation.hold = False
    info = {"device": "NVIDIA-L4", "simulated": "true", "model": "tiny-target",
            "draft": "tiny-draft", "version": ""}  # fmt: skip
    metrics = EngineMetrics(info)
    before = bench.parse_scrape(generate_latest(metrics.registry).decode())
    for job in jobs:
        engine.add_request(job.prompt, SamplingParams(max_tokens=job.output, ignore_eos=True))
    batches, modes = [], set()
    while engine.has_work():
        count = len(engine.iterations)
        engine.step()
        if len(engine.iterations) == count:
            continue
        iteration = engine.iterations[-1]
        metrics.observe_iteration(iteration)
        if iteration.mode != "prefill":
            batches.append(iteration.batch_size)
            modes.add(iteration.mode)
    after = bench.parse_scrape(generate_latest(metrics.registry).decode())
    counts, mean = bench.running_batch(after.counters - before.counters)
    assert modes == {"spec", "plain"} and len(set(batches)) > 3, (modes, batches)
    assert counts == Counter(c.batch_bucket(b) for b in batches)
    assert mean == pytest.approx(sum(batches) / len(batches), rel=1e-12)
