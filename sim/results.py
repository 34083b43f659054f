"""What a simulation writes to sim.json. `SimResult.model_json_schema()` is the published JSON
Schema; tests validate every sim.json against it. Every number is simulated: the device times
are engine/device_time.py's roofline of a well-tuned engine on each SKU, not a measurement.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Window(Out):
    """One report window of one run."""

    start_s: float
    seconds: float  # its length: the last window may be cut short by the run's end
    arrivals: int
    finished: int  # answered in full
    rejected: int
    slo_met: int
    goodput: float  # SLO-met requests per second (finished in the window)
    decode_tokens_per_s: float
    tpot_p50_ms: float  # median time per output token of the requests finished (0: none)
    mean_running: float  # running batch per ready pod, time-averaged
    pods: float  # ready pods, time-averaged
    explored_share: float  # decode iterations run in the mode the gate did not pick
    thresholds: dict[str, int | None]  # SKU -> threshold at the window's end (None: always)
    # with a bulk class: per class, requests finished in the window within their class's SLO
    slo_met_by_workload: dict[str, int] = Field(default_factory=dict)


class ThresholdPoint(Out):
    """The threshold (and crossover) a SKU's engines were told to run, each time it changed;
    a SKU's first point is the operator's first target. SKUs are named by their
    nvidia.com/gpu.product label, as the engines' metrics name them."""

    at_s: float
    sku: str
    threshold: int | None
    crossover: float | None = None  # the batch size the operator measured, when it crossed


class OperatorEvent(Out):
    at_s: float
    reason: str
    message: str
    warning: bool = False


class Calibration(Out):
    """One calibration: what started it, when, and how long until it decided."""

    trigger: str
    started_s: float
    decided_s: float | None  # None: still running at the end
    outcome: (
        str  # the Event that ended it (ThresholdChanged, ThresholdKept, CalibrationFailed, ...)
    )


class Workload(Out):
    """One class of requests over a run, each judged against its class's SLO."""

    requests: int
    finished: int
    slo_met: int
    goodput: float  # SLO-met requests per second over the run
    tpot_p50_ms: float


class Run(Out):
    policy: str  # auto | never | always | a fixed threshold
    seed: int
    requests: int
    finished: int
    rejected: int
    slo_met: int
    goodput: float  # SLO-met requests per second over the run
    decode_tokens_per_s: float
    tpot_p50_ms: float
    explored_share: float
    iterations: int  # decode iterations simulated, every pod
    windows: list[Window]
    thresholds: list[ThresholdPoint] = Field(default_factory=list)
    events: list[OperatorEvent] = Field(default_factory=list)
    calibrations: list[Calibration] = Field(default_factory=list)
    prometheus_queries: int = 0
    wall_seconds: float  # real time this run took to simulate
    workloads: dict[str, Workload] = Field(default_factory=dict)  # with a bulk class: per class


class SimResult(Out):
    """A scenario's runs: every policy under every seed, with the same arrivals per seed."""

    scenario: str
    inputs: dict[str, Any]  # the scenario as validated, defaults filled in: what was simulated
    simulated: bool = True  # always: a modelled clock, not a measurement
    duration_s: float  # virtual time simulated per run
    window_s: float
    pod_hours: float  # virtual pod-hours simulated, all runs
    wall_seconds: float
    runs: list[Run]
