"""The operator's own Prometheus metrics: what it decided for each SpecDeployment.

Read from the SpecDeployments' status at scrape time (as kube-state-metrics does), so they
always say what `kubectl get sd` says, a restarted operator loses nothing, and alerts and
dashboards need no access to the API server. Names are defined here once; the chart's alerts
and dashboard may use only these and the engine's (engine/contract.py).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from spectune.operator import kube
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

ALL_METRICS = (
    CONDITION, CONDITION_TRANSITION, THRESHOLD, RECOMMENDED_THRESHOLD, CROSSOVER,
    READY_REPLICAS, REPLICAS,
)  # fmt: skip

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
    return [condition, transition, threshold, recommended, crossover, ready, replicas]


class StatusCollector(Collector):
    """Lists the SpecDeployments the operator watches on every scrape."""

    def __init__(self, namespaces: list[str] | None) -> None:
        self.namespaces = namespaces

    def collect(self) -> Iterator[GaugeMetricFamily]:
        resource = kube.dynamic().resources.get(api_version=f"{GROUP}/{VERSION}", kind=KIND)
        items: list[dict[str, Any]] = []
        for namespace in self.namespaces or [None]:
            items.extend(resource.get(namespace=namespace).to_dict()["items"])
        yield from families(items)


def serve(address: str, namespaces: list[str] | None) -> None:
    """Serve /metrics on HOST:PORT in a thread of its own (kopf's loop stays unblocked)."""
    host, _, port = address.rpartition(":")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(namespaces))
    start_http_server(int(port), host, registry=registry)
