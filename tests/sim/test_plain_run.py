"""The fast path (sim/plain_run.py: a run of plain iterations writes a sequence only when
something reads it) against the engine's way (`per_iteration`: every sequence every
iteration): the same scenario both ways gives the same run and the same series on every pod,
through the cases where a run ends (speculation, exploration, preemption) and where members
leave it (finishing, draining pods)."""

from __future__ import annotations

import pytest

from spectune.sim.scenario import Policy
from tests.sim.support import same, scenario, simulated


@pytest.mark.parametrize("policy", ["auto", 16, "never"])
def test_plain_runs_give_the_engines_metrics_exactly(policy: Policy) -> None:
    """Two A100 pods with KV for a few dozen sequences (so batches preempt), prompts x3 half
    way, and a scale down to one pod that drains the other."""
    sc = scenario(
        traffic={"rate": 24, "prompt_tokens": 256, "output_tokens": 200, "duration_s": 240},
        acceptance={"mean": 0.7, "spread": 0.15},
        fleet={"pools": [{"sku": "A100", "replicas": 2}], "startup_s": 5, "kv_cache_gib": 1.5},
        events=[
            {"kind": "context", "at_s": 120, "scale": 3},
            {"kind": "scale", "at_s": 180, "replicas": 1},
        ],
    )
    fast, reference = simulated(sc, policy, False), simulated(sc, policy, True)
    same(
        fast.result(0.0).model_dump(exclude={"wall_seconds"}),
        reference.result(0.0).model_dump(exclude={"wall_seconds"}),
    )
    assert [p.name for p in fast.pods] == [p.name for p in reference.pods]
    for f, r in zip(fast.pods, reference.pods, strict=True):
        same(dict(f.engine.series.values), dict(r.engine.series.values), f.name)
        assert f.engine.scheduler.num_preemptions == r.engine.scheduler.num_preemptions
        assert f.engine.scheduler.blocks.num_free == r.engine.scheduler.blocks.num_free
    assert sum(p.engine.scheduler.num_preemptions for p in reference.pods) > 0
    assert fast.result(0.0).finished > 0
