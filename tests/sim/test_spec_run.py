"""The speculating fast path (sim/spec_run.py: a run of spec iterations holds its members'
fields apart from their Sequences) against the engine's way (`per_iteration`: every sequence
read and written every iteration): a fleet that speculates every iteration gives the same run,
the same series on every pod and the same requests' times (floats to the last few digits: a run
sums the equal inter-token gaps of a batch as a product; the rest to the last digit, drawn in
the engine's order), through pauses, idle members, catch-ups, preemption, finishing and a pod
draining."""

from __future__ import annotations

from typing import Any

import pytest

from tests.sim.support import BASE, same, scenario, simulated

DRAFT = BASE["spec"]["speculation"]
NGRAM = {"method": "ngram", "numSpeculativeTokens": 3}


@pytest.mark.parametrize("speculation", [DRAFT, NGRAM], ids=["draft-k4", "ngram-k3"])
def test_spec_runs_give_the_engines_results_exactly(speculation: dict[str, Any]) -> None:
    """Two A100 pods with KV for a few dozen sequences (so batches preempt), acceptance low
    and spread (so sequences pause, and their drafts fall behind), prompts x3 half way, and a
    scale down to one pod that drains the other."""
    sc = scenario(
        traffic={"rate": 24, "prompt_tokens": 256, "output_tokens": 200, "duration_s": 240},
        acceptance={"mean": 0.35, "spread": 0.2},
        fleet={"pools": [{"sku": "A100", "replicas": 2}], "startup_s": 5, "kv_cache_gib": 1.5},
        spec=BASE["spec"] | {"speculation": speculation},
        events=[
            {"kind": "context", "at_s": 120, "scale": 3},
            {"kind": "scale", "at_s": 180, "replicas": 1},
        ],
    )
    fast, reference = simulated(sc, "always", False), simulated(sc, "always", True)
    same(
        fast.result(0.0).model_dump(exclude={"wall_seconds"}),
        reference.result(0.0).model_dump(exclude={"wall_seconds"}),
    )
    times = [(r.first_token_at, r.done_at, r.outcome, r.slo_met) for r in reference.requests]
    assert [(r.first_token_at, r.done_at, r.outcome, r.slo_met) for r in fast.requests] == times
    assert [p.name for p in fast.pods] == [p.name for p in reference.pods]
    for f, r in zip(fast.pods, reference.pods, strict=True):
        same(dict(f.engine.series.values), dict(r.engine.series.values), f.name)
        assert f.engine.scheduler.num_preemptions == r.engine.scheduler.num_preemptions
        assert f.engine.scheduler.blocks.num_free == r.engine.scheduler.blocks.num_free
        assert f.engine.device.modelled == r.engine.device.modelled
    assert sum(p.engine.scheduler.num_preemptions for p in reference.pods) > 0
    assert fast.result(0.0).finished > 0
