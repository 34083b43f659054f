"""The operator's counters without a cluster: the real state machine's steps are recorded
(calibrations by trigger and outcome, threshold changes per SKU, rollbacks, Prometheus
errors) and read back from a registry of their own; the last calibration's time is a gauge
from the status."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from spectune.operator import metrics
from spectune.operator.autotune import Observation, State, step
from tests.operator.machine import (
    H100,
    L4,
    WINDOW,
    curve,
    fresh,
    observe,
    spec,
    traffic,
    window,
)

KEY = {"namespace": "ns", "specdeployment": "llm"}


class Recorder:
    """Steps the state machine like reconcile does, recording every step."""

    def __init__(self, s) -> None:
        self.spec, self.state = s, fresh(s)
        self.registry = CollectorRegistry()
        self.counters = metrics.Counters(self.registry)

    def __call__(self, obs: Observation) -> State:
        tuned = step(self.spec, self.state, obs)
        self.counters.record("ns", "llm", self.state, obs, tuned)
        self.state = tuned.state
        return self.state

    def value(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, {**KEY, **labels})

    @property
    def prometheus_errors(self) -> float | None:
        return self.registry.get_sample_value(metrics.PROMETHEUS_ERRORS)

    def calibrations(self, outcome: str, trigger: str = "Initial") -> float | None:
        return self.value(metrics.CALIBRATIONS, trigger=trigger, outcome=outcome)


def test_a_kept_change_counts_one_verified_calibration_and_a_change_per_sku() -> None:
    run = Recorder(spec())
    run(observe(0, window({}, {"e-0": H100, "e-1": L4})))
    # every outcome from 0 once started, so that increase() sees the first one end
    assert run.calibrations("verified") == 0 and run.calibrations("failed") == 0
    stats = {H100: curve(12), L4: curve(4)}  # L4 stays at the deployment's 4
    run(observe(WINDOW, window(stats, {"e-0": H100, "e-1": L4})))
    assert run.value(metrics.THRESHOLD_CHANGES, sku=H100) == 1
    assert run.value(metrics.THRESHOLD_CHANGES, sku=L4) is None
    assert run.calibrations("verified") == 0  # still verifying
    run(observe(2 * WINDOW, window(stats, {"e-0": H100, "e-1": L4})))
    assert run.calibrations("verified") == 1
    assert run.value(metrics.ROLLBACKS) is None
    assert run.prometheus_errors == 0


def test_a_deleted_specdeployments_counters_go_with_it() -> None:
    """Issue 59, J: the counters of every SpecDeployment ever tuned were exported for ever."""
    run = Recorder(spec())
    run(observe(0, window(load=traffic(slo_met_share=0.95))))
    run(observe(30, window({H100: curve(12)})))
    run(observe(30 + WINDOW, window({H100: curve(12)}, load=traffic(slo_met_share=0.7))))
    assert run.value(metrics.ROLLBACKS) == 1 and run.calibrations("rolled_back") == 1
    run.counters.forget("ns", "llm")
    assert run.value(metrics.ROLLBACKS) is None and run.calibrations("rolled_back") is None
    assert run.value(metrics.THRESHOLD_CHANGES, sku=H100) is None


def test_a_goodput_drop_counts_a_rollback() -> None:
    run = Recorder(spec())
    run(observe(0, window(load=traffic(slo_met_share=0.95))))
    run(observe(30, window({H100: curve(12)})))
    run(observe(30 + WINDOW, window({H100: curve(12)}, load=traffic(slo_met_share=0.7))))
    assert run.value(metrics.ROLLBACKS) == 1
    assert run.calibrations("rolled_back") == 1
    assert run.value(metrics.THRESHOLD_CHANGES, sku=H100) == 1  # the move, not the way back


@pytest.mark.parametrize(
    ("mode", "last", "outcome"),
    [
        ("Auto", window({}), "failed"),  # no bucket measured in both modes
        ("Auto", None, "aborted"),  # Prometheus gone mid-calibration
        ("Advisory", window({H100: curve(12)}), "recommended"),
        ("Auto", window({H100: curve(4)}), "kept"),  # at the crossover already
    ],
)
def test_each_end_of_a_calibration_is_its_outcome(mode, last, outcome) -> None:
    run = Recorder(spec(mode))
    run(observe(0, window()))
    run(observe(WINDOW, last, error=None if last else "connection refused"))
    assert run.state.calibration.phase == "Idle"
    assert run.calibrations(outcome) == 1
    others = [o for o in metrics.OUTCOMES.values() if o != outcome]
    assert all(run.calibrations(o) == 0 for o in others)
    assert run.prometheus_errors == (0 if last else 1)


def test_switching_to_manual_cancels_and_idle_errors_still_count() -> None:
    run = Recorder(spec())
    run(observe(0, None, error="timeout"))  # idle: nothing starts, the error counts
    assert run.prometheus_errors == 1
    run(observe(10, window()))
    run.spec = spec("Manual")
    run(observe(20, window()))
    assert run.calibrations("cancelled") == 1


def test_the_last_calibration_time_comes_from_the_status() -> None:
    obj = {
        "metadata": {"namespace": "ns", "name": "llm"},
        "status": {"calibration": {"phase": "Idle", "finishedAt": "2026-11-30T10:00:00+00:00"}},
    }
    samples = {f.name: f.samples for f in metrics.families([obj])}
    (last,) = samples[metrics.LAST_CALIBRATION]
    assert last.labels == KEY and last.value == 1796032800.0
    never = {"metadata": {"namespace": "ns", "name": "new"}, "spec": {}}
    assert not {f.name: f.samples for f in metrics.families([never])}[metrics.LAST_CALIBRATION]


def test_every_name_is_served_from_one_registry() -> None:
    families = {f.name for f in metrics.families([])}
    assert families == set(metrics.STATUS_METRICS)
    served = {s.name for f in metrics.REGISTRY.collect() for s in f.samples}
    counters = {f.name + "_total" for f in metrics.REGISTRY.collect() if f.type == "counter"}
    assert counters == set(metrics.EVENT_METRICS)
    assert metrics.PROMETHEUS_ERRORS in served  # unlabelled: present from the start
