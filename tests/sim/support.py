"""The scenario the simulator tests start from: one simulated A100 pod, a draft model with
k=4, 0.7 acceptance per drafted token, 60 s calibration windows, 5 s scrapes and no dwell; a
scenario run the fast paths' way or the engine's, and the comparison of the two, for the tests
that hold one to the other."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from spectune.sim.arrivals import arrivals, duration
from spectune.sim.fleet import FleetSim
from spectune.sim.scenario import Policy, Scenario, parse_scenario

BASE: dict[str, Any] = {
    "name": "t",
    "traffic": {"rate": 12, "prompt_tokens": 64, "output_tokens": 128, "duration_s": 300},
    "acceptance": {"mean": 0.7, "spread": 0.0},
    "fleet": {"pools": [{"sku": "A100", "replicas": 1}], "startup_s": 5, "kv_cache_gib": 60},
    "spec": {
        "model": {"name": "llama-8b"},
        "engine": {"maxBatchSize": 256},
        "speculation": {"method": "draft", "draft": "llama-1b", "numSpeculativeTokens": 4},
        "slo": {"ttftMilliseconds": 2000, "tpotMilliseconds": 100},
        "tuning": {"calibrationWindowSeconds": 60, "minDwellSeconds": 0},
    },
    "operator": {"scrape_interval_s": 5},  # 12 scrapes a window: the operator needs 8
    "policies": ["auto"],
    "window_s": 60,
}


def scenario(**changes: Any) -> Scenario:
    """BASE with top-level keys replaced."""
    return parse_scenario(copy.deepcopy(BASE) | changes)


def simulated(sc: Scenario, policy: Policy, per_iteration: bool) -> FleetSim:
    """`sc` run under `policy` (seed 0), the fast paths' way or (`per_iteration`) the
    engine's."""
    requests = arrivals(sc, 0)
    sim = FleetSim(sc, policy, 0, requests, duration(sc, requests), per_iteration=per_iteration)
    sim.run()
    return sim


def same(fast: Any, reference: Any, where: str = "") -> None:
    """Equal, floats to the last few digits (a run sums a batch's equal inter-token gaps as a
    product where the engine adds them one by one)."""
    if isinstance(reference, dict):
        assert fast.keys() == reference.keys(), where
        for key in reference:
            same(fast[key], reference[key], f"{where}.{key}")
    elif isinstance(reference, list):
        assert len(fast) == len(reference), where
        for i, (f, r) in enumerate(zip(fast, reference, strict=True)):
            same(f, r, f"{where}[{i}]")
    elif isinstance(reference, float):
        assert fast == pytest.approx(reference, rel=1e-9, abs=1e-9), where
    else:
        assert fast == reference, where
