"""Inputs for the calibration state machine without a cluster: specs, curves whose speedup
crosses 1.0 where a test says, traffic and fleet windows as the Prometheus reader returns them,
observations and a fresh state."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from spectune.engine.crossover import ModeStats, StatsByBucket
from spectune.operator.autotune import Observation, State
from spectune.operator.models import CalibrationStatus, CrossoverStatus, ThresholdStatus, parse_spec
from spectune.operator.observations import EngineInfo, FleetWindow, Traffic
from spectune.operator.status import threshold_status

H100, L4 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-L4"
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
WINDOW = 60  # tuning.calibrationWindowSeconds
BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48)


def spec(mode: str = "Auto", value: int | None = 4, **tuning: int):
    """A SpecDeployment's spec; its crossover where speedup falls to 1 (`requiredGainPercent`
    0), where `curve` puts it, unless a test asks for a gain."""
    threshold = {"mode": mode} | ({"value": value} if value is not None else {})
    base = {"calibrationWindowSeconds": WINDOW, "minDwellSeconds": 300, "requiredGainPercent": 0}
    return parse_spec(
        {
            "replicas": 2,
            "model": {"name": "tiny-target"},
            "speculation": {"method": "ngram", "threshold": threshold},
            "tuning": base | tuning,
        }
    )


def curve(crossover: float, steps: int = 100, buckets: tuple[int, ...] = BUCKETS) -> StatsByBucket:
    """Sums whose speedup falls steadily through exactly 1.0 at batch `crossover`."""
    stats: StatsByBucket = {}
    for b in buckets:
        speedup = (crossover / b) ** 0.3
        stats[("plain", b)] = ModeStats(steps, steps * b, steps * 0.01)
        stats[("spec", b)] = ModeStats(steps, 2 * steps * b, 2 * steps * 0.01 / speedup)
    return stats


def elsewhere(sku: str = H100, bucket: int = 96) -> dict[str, StatsByBucket]:
    """Plain decode steps at one batch bucket past what the tests' calibrations measure: where
    a replica change moved each pod's load (the Replicas trigger fires only on such a move)."""
    return {sku: {("plain", bucket): ModeStats(100, 100 * bucket, 1.0)}}


def traffic(rate: float = 10.0, slo_met_share: float = 0.95, seconds: float = WINDOW) -> Traffic:
    requests = rate * seconds
    return Traffic(
        seconds=seconds,
        requests=requests,
        slo_met=requests * slo_met_share,
        ok_requests=requests,
        rejected_requests=0,
        decode_tokens=requests * 100,
        drafted_tokens=1000.0,
        accepted_tokens=600.0,
        engines=2.0,
    )


def window(
    steps: dict[str, StatsByBucket] | None = None,
    pods: dict[str, str] | None = None,
    load: Traffic | None = None,
    interval: float | None = 5.0,
) -> FleetWindow:
    pods = pods if pods is not None else {"e-0": H100, "e-1": H100}
    engines = {p: EngineInfo(p, d, "tiny-target", "", "0.1", True, 1.0) for p, d in pods.items()}
    return FleetWindow(engines, steps if steps is not None else {}, load or traffic(), interval)


def observe(at: float, w: FleetWindow | None, replicas: int = 2, **kw) -> Observation:
    return Observation(T0 + timedelta(seconds=at), replicas, True, w, **kw)


def fresh(s) -> State:
    return State(threshold_status(s, ThresholdStatus()), CrossoverStatus(), (), CalibrationStatus())
