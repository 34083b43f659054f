"""Whole runs of small scenarios: the operator's own decisions in the loop, in virtual time.
Each runs a few simulated minutes in a few seconds of real time. Numbers are simulated (the
SKUs' device-time model), so the assertions are about decisions and bookkeeping, not speed."""

from __future__ import annotations

import copy
import gc

import pytest

from spectune.engine.device_time import LLAMA_1B, LLAMA_8B, SKUS, Setting, analytic_crossover
from spectune.sim.arrivals import arrivals, duration
from spectune.sim.fleet import EPOCH, FleetSim
from spectune.sim.results import Run
from spectune.sim.run import simulate
from tests.sim.support import BASE, scenario


def only(runs: list[Run], policy: str) -> Run:
    return next(r for r in runs if r.policy == policy)


def test_a_seed_replays_exactly_and_every_policy_gets_the_same_arrivals() -> None:
    sc = scenario(
        policies=["auto", "never", 16],
        traffic={"rate": 8, "prompt_tokens": 64, "output_tokens": 128, "duration_s": 120},
    )
    first, again = simulate(sc), simulate(sc, policies=["auto"])
    a, b = only(first.runs, "auto"), only(again.runs, "auto")
    assert a.model_dump(exclude={"wall_seconds"}) == b.model_dump(exclude={"wall_seconds"})
    assert len({r.requests for r in first.runs}) == 1  # common random numbers
    assert only(first.runs, "never").explored_share == 0.0
    assert all(
        w.thresholds == {"NVIDIA-A100-SXM4-40GB": 16} for w in only(first.runs, "16").windows
    )


def test_auto_measures_a_threshold_and_verifies_it() -> None:
    run = only(simulate(scenario()).runs, "auto")
    first = run.calibrations[0]
    assert first.trigger == "Initial" and first.outcome == "ThresholdChanged"
    assert first.decided_s is not None and first.decided_s - first.started_s <= 90
    reasons = [e.reason for e in run.events]
    assert "ThresholdVerified" in reasons and "RolledBack" not in reasons
    changed = [p for p in run.thresholds if p.threshold is not None]
    assert changed, "no threshold was set"
    # exploration is raised only while calibrating: the steady windows run at most the base 2%
    assert run.windows[-1].explored_share < 0.06 < run.windows[0].explored_share


def test_the_crossover_measured_on_live_traffic_is_the_device_models() -> None:
    """Prompts x4 at 70% of the load half way, batches either side of the new crossover (at
    80% every batch is past it and the measurement is one-sided): the operator re-measures (a
    traffic trigger) and both crossovers it commits lie within 10% of the roofline's with the
    draft's prefill spread over each request. The prefill outweighs the longer contexts' extra
    KV reads here, so the crossover falls (64 -> 256 prompt tokens: 65 -> 62 in the model).
    The crossover compared is the roofline's, where speedup falls to 1: no required gain."""
    spec = copy.deepcopy(BASE["spec"])
    spec["tuning"]["requiredGainPercent"] = 0
    sc = scenario(
        traffic={"rate": 28, "prompt_tokens": 64, "output_tokens": 128, "duration_s": 450},
        events=[{"kind": "context", "at_s": 200, "scale": 4}, {"kind": "load", "at_s": 200,
                                                             "scale": 0.7}],
        spec=spec,
    )  # fmt: skip
    run = only(simulate(sc).runs, "auto")
    after = [c for c in run.calibrations if c.started_s > 200]
    assert after and after[0].trigger == "Traffic" and after[0].started_s <= 200 + 4 * 60
    measured = [p.crossover for p in run.thresholds if p.crossover is not None]
    assert len(measured) == 2, run.thresholds

    def model(prompt: int) -> float:
        setting = Setting(
            SKUS["A100"], LLAMA_8B, LLAMA_1B, 4, 0.7, prompt + 64, requests=(prompt, 128)
        )
        crossover = analytic_crossover(setting)
        assert crossover is not None
        return crossover

    assert measured[0] == pytest.approx(model(64), rel=0.1)
    assert measured[1] == pytest.approx(model(256), rel=0.1)
    assert measured[1] < measured[0]


def test_a_prometheus_outage_changes_no_threshold_and_tuning_resumes() -> None:
    sc = scenario(
        traffic={"rate": 12, "prompt_tokens": 64, "output_tokens": 128, "duration_s": 360},
        events=[{"kind": "prometheus_outage", "at_s": 20, "duration_s": 100}],
    )
    run = only(simulate(sc).runs, "auto")
    during = [e for e in run.events if 20 <= e.at_s < 120]
    assert not [e for e in during if e.reason == "ThresholdChanged"]
    assert any(c.trigger == "Initial" and c.started_s >= 120 for c in run.calibrations)


def test_a_scale_up_adds_pods_that_serve_and_are_measured() -> None:
    sc = scenario(
        traffic={"rate": 12, "prompt_tokens": 64, "output_tokens": 128, "duration_s": 300},
        events=[{"kind": "scale", "at_s": 120, "replicas": 3}],
    )
    run = only(simulate(sc).runs, "auto")
    assert run.windows[0].pods == pytest.approx(1, abs=0.2)
    assert run.windows[-1].pods == pytest.approx(3, abs=0.01)
    assert run.finished > 0.9 * run.requests


def test_every_request_ends_in_exactly_one_window() -> None:
    """Windows count the requests that arrived and ended in them (a window reads only the
    requests still open at the last one's end and those that arrived since): over the run
    every arrival is counted once, and every request that ended before the run did, once, in
    the window it ended in. Overload with a short queue so that some are rejected, and
    requests long enough to span windows."""
    sc = scenario(
        traffic={"rate": 12, "prompt_tokens": 256, "output_tokens": 600, "duration_s": 90},
        fleet={"pools": [{"sku": "A100", "replicas": 1}], "startup_s": 0, "max_queue": 4,
               "kv_cache_gib": 6},
        window_s=20,
    )  # fmt: skip
    requests = arrivals(sc, 0)
    sim = FleetSim(sc, "never", 0, requests, duration(sc, requests))
    sim.run()
    windows = sim.windows
    assert [w.start_s for w in windows] == [0, 20, 40, 60, 80]
    assert sum(w.arrivals for w in windows) == len(sim.requests)
    ended = [r for r in sim.requests if r.done_at is not None and r.done_at - EPOCH < 90]
    for outcome, counted in (("ok", "finished"), ("rejected", "rejected")):
        by_window = [
            sum(r.outcome == outcome for r in ended if 0 <= r.done_at - EPOCH - w.start_s < 20)
            for w in windows
        ]
        assert [getattr(w, counted) for w in windows] == by_window
        assert min(by_window[1:]) > 0, outcome  # each kind ends in every window but the first
    assert sum(w.slo_met for w in windows) == sum(r.slo_met for r in ended)
    assert len(ended) < len(sim.requests)  # some were still running when it ended


def test_a_run_makes_no_reference_cycles_so_it_runs_with_the_collector_paused() -> None:
    """FleetSim.run pauses Python's cyclic collector (its passes over a big fleet's live objects
    cost a sixth of the CPU): sound only while a run leaves nothing for it to find. Every kind
    of turn is here: calibrations, a rollback check, preemption (KV for a few dozen
    sequences), an autoscaler, pods leaving in a migration, shifts, an outage and a restart."""
    sc = scenario(
        traffic={"rate": 20, "prompt_tokens": 128, "output_tokens": 128, "duration_s": 300},
        acceptance={"mean": 0.5, "spread": 0.2},
        fleet={
            "pools": [{"sku": "A100", "replicas": 2}, {"sku": "L4", "replicas": 0}],
            "startup_s": 5, "kv_cache_gib": 1.5,
        },
        autoscaler={"target": 24, "min": 1, "max": 4, "period_s": 15, "stabilization_s": 30},
        events=[
            {"kind": "prometheus_outage", "at_s": 100, "duration_s": 20},
            {"kind": "operator_restart", "at_s": 130},
            {"kind": "context", "at_s": 150, "scale": 2},
            {"kind": "acceptance", "at_s": 160, "mean": 0.8},
            {"kind": "load", "at_s": 170, "scale": 0.5},
            {"kind": "migrate", "at_s": 240, "from_sku": "A100", "to_sku": "L4"},
        ],
    )  # fmt: skip
    requests = arrivals(sc, 0)
    enabled: list[bool] = []
    sim = FleetSim(sc, "auto", 0, requests, duration(sc, requests), lambda _: enabled.append(
        gc.isenabled()
    ))  # fmt: skip
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds stays in gc.garbage to count
    try:
        sim.run()
        gc.collect()
        cycles = len(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert cycles == 0, f"the run left {cycles} objects in reference cycles"
    assert enabled and not any(enabled)
    assert gc.isenabled()
    assert sum(p.engine.scheduler.num_preemptions for p in sim.pods) > 0
    assert sim.pods and all(p.sku == "L4" for p in sim.pods)  # the A100 pods left
    reasons = {e.reason for e in sim.result(0.0).events}
    assert {"ThresholdChanged", "ThresholdVerified"} <= reasons, reasons
