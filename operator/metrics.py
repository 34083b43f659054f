"""The operator's own Prometheus metrics: what it decided for each SpecDeployment.

The gauges are read from the SpecDeployments' status at scrape time (as kube-state-metrics
does), so they always say what `kubectl get sd` says, a restarted operator loses nothing, and
alerts and dashboards need no access to the API server. The counters count what the autotuner
did (its Events) in this process: only the acting replica counts, and a restart resets them,
which `increase()` absorbs. Names are defined here once; the chart's alerts and dashboard may
use only these and the engine's (engine/contract.py).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from spectune.operator import kube
from spectune.operator.autotune import Observation, State, Step, thresholds_by_sku
from spectune.operator.models import GROUP, KIND, VERSION

# gauge = 1 per condition, labels namespace, specdeployment, type, status, reason
CONDITION = "spectune_operator_condition"
# gauge, labels namespace, specdeployment, type: changes() of it counts transitions
CONDITION_TRANSITION = "spectune_operator_condition_last_transition_timestamp_seconds"
THRESHOLD = "spectune_operator_threshold"  # gauge, labels namespace, specdeployment, source
RECOMMENDED_THRESHOLD = "spectune_operator_recommended_threshold"  # gauge, same labels
CROSSOVER = "spectune_operator_crossover_batch_size"  # gauge, labels ..., sku
READY_REPLICAS = "spectune_operator_ready_replicas"  # gauge, labels namespace, specdeployment
REPLICAS = "spectune_operator_replicas"  # gauge: desired engine replicas
# gauge, labels namespace, specdeployment: status.calibration.finishedAt
LAST_CALIBRATION = "spectune_operator_last_calibration_timestamp_seconds"
# counter, labels namespace, specdeployment, trigger, outcome: finished calibrations
CALIBRATIONS = "spectune_operator_calibrations_total"
# counter, labels namespace, specdeployment, sku: thresholds Auto moved
THRESHOLD_CHANGES = "spectune_operator_threshold_changes_total"
ROLLBACKS = "spectune_operator_rollbacks_total"  # counter, labels namespace, specdeployment
PROMETHEUS_ERRORS = "spectune_operator_prometheus_errors_total"  # counter: failed reads

STATUS_METRICS = (
    CONDITION, CONDITION_TRANSITION, THRESHOLD, RECOMMENDED_THRESHOLD, CROSSOVER,
    READY_REPLICAS, REPLICAS, LAST_CALIBRATION,
)  # fmt: skip
EVENT_METRICS = (CALIBRATIONS, THRESHOLD_CHANGES, ROLLBACKS, PROMETHEUS_ERRORS)
ALL_METRICS = STATUS_METRICS + EVENT_METRICS

KEYS = ["namespace", "specdeployment"]


def _timestamp(rfc3339: str) -> float:
    return datetime.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def families(items: list[dict[str, Any]]) -> list[GaugeMetricFamily]:
    """The metric families for these SpecDeployment objects (pure: tested without a cluster)."""
    condition = GaugeMetricFamily(
        CONDITION,
        "SpecDeployment conditions (1 per condition)",
        labels=[*KEYS, "type", "status", "reason"],
    )
    transition = GaugeMetricFamily(
        CONDITION_TRANSITION, "when a condition last changed status", labels=[*KEYS, "type"]
    )
    threshold = GaugeMetricFamily(
        THRESHOLD, "threshold the engines run with", labels=[*KEYS, "source"]
    )
    recommended = GaugeMetricFamily(
        RECOMMENDED_THRESHOLD, "threshold the operator recommends", labels=KEYS
    )
    crossover = GaugeMetricFamily(CROSSOVER, "measured crossover batch size", labels=[*KEYS, "sku"])
    ready = GaugeMetricFamily(READY_REPLICAS, "engine replicas ready", labels=KEYS)
    replicas = GaugeMetricFamily(REPLICAS, "engine replicas wanted", labels=KEYS)
    last = GaugeMetricFamily(LAST_CALIBRATION, "when the last calibration ended", labels=KEYS)
    for obj in items:
        key = [obj["metadata"]["namespace"], obj["metadata"]["name"]]
        status = obj.get("status") or {}
        for c in status.get("conditions") or []:
            condition.add_metric([*key, c["type"], c["status"], c.get("reason", "")], 1)
            transition.add_metric([*key, c["type"]], _timestamp(c["lastTransitionTime"]))
        thresholds = status.get("threshold") or {}
        if thresholds.get("current") is not None:
            threshold.add_metric([*key, thresholds.get("source", "")], thresholds["current"])
        if thresholds.get("recommended") is not None:
            recommended.add_metric(key, thresholds["recommended"])
        measured = status.get("crossover") or {}
        if measured.get("batchSize") is not None:
            crossover.add_metric([*key, measured.get("sku") or ""], measured["batchSize"])
        ready.add_metric(key, status.get("readyReplicas", 0))
        replicas.add_metric(key, (obj.get("spec") or {}).get("replicas", 0))
        finished = (status.get("calibration") or {}).get("finishedAt")
        if finished is not None:
            last.add_metric(key, _timestamp(finished))
    return [condition, transition, threshold, recommended, crossover, ready, replicas, last]


class StatusCollector(Collector):
    """Lists the SpecDeployments the operator watches on every scrape."""

    def __init__(self, namespaces: list[str] | None) -> None:
        self.namespaces = namespaces

    def collect(self) -> Iterator[GaugeMetricFamily]:
        resource = kube.resource(f"{GROUP}/{VERSION}", KIND)
        items: list[dict[str, Any]] = []
        for namespace in self.namespaces or [None]:
            items.extend(resource.get(namespace=namespace).to_dict()["items"])
        yield from families(items)


# How a calibration ended, by the Event that ended it; the first that occurs wins (Advisory
# and Auto post one per SKU).
OUTCOMES = {
    "RolledBack": "rolled_back",
    "ThresholdVerified": "verified",
    "CalibrationFailed": "failed",
    "CalibrationAborted": "aborted",
    "CalibrationCancelled": "cancelled",
    "CalibrationRestarted": "restarted",
    "ThresholdRecommended": "recommended",
    "ThresholdKept": "kept",
}


class Counters:
    """The autotuner's counters, on `registry` (tests give each its own)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calibrations = Counter(
            CALIBRATIONS,
            "calibrations finished, by what started and what ended them",
            [*KEYS, "trigger", "outcome"],
            registry=registry,
        )
        self.threshold_changes = Counter(
            THRESHOLD_CHANGES, "thresholds moved on measurement", [*KEYS, "sku"], registry=registry
        )
        self.rollbacks = Counter(
            ROLLBACKS, "threshold changes undone as goodput fell", KEYS, registry=registry
        )
        self.prometheus_errors = Counter(
            PROMETHEUS_ERRORS, "reads of the engines' metrics that failed", registry=registry
        )

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted SpecDeployment's series: they would be exported for ever."""
        for counter in (self.calibrations, self.threshold_changes, self.rollbacks):
            for labels in [k for k in counter._metrics if k[:2] == (namespace, name)]:
                counter.remove(*labels)

    def record(
        self, namespace: str, name: str, before: State, observation: Observation, step: Step
    ) -> None:
        """Count what one `autotune.step` from `before` did (pure but for the counters)."""
        key = (namespace, name)
        reasons = {e.reason for e in step.events}
        if observation.error is not None:
            self.prometheus_errors.inc()
        if "CalibrationStarted" in reasons:
            # every outcome's series from 0, so increase() counts this calibration's end too
            for outcome in OUTCOMES.values():
                self.calibrations.labels(*key, step.state.calibration.trigger or "", outcome)
        if before.calibration.phase != "Idle" and step.state.calibration.phase == "Idle":
            outcome = next((o for r, o in OUTCOMES.items() if r in reasons), "unknown")
            trigger = before.calibration.trigger or ""
            self.calibrations.labels(*key, trigger, outcome).inc()
        if "ThresholdChanged" in reasons:
            old = thresholds_by_sku(before)
            for s in step.state.per_sku:
                if s.threshold != old.get(s.sku, before.threshold.current):
                    self.threshold_changes.labels(*key, s.sku).inc()
        if "RolledBack" in reasons:
            self.rollbacks.labels(*key).inc()


REGISTRY = CollectorRegistry(auto_describe=False)  # what `serve` serves
COUNTERS = Counters(REGISTRY)


def serve(address: str, namespaces: list[str] | None) -> None:
    """Serve /metrics on HOST:PORT in a thread of its own (kopf's loop stays unblocked)."""
    host, _, port = address.rpartition(":")
    REGISTRY.register(StatusCollector(namespaces))
    start_http_server(int(port), host, registry=REGISTRY)
