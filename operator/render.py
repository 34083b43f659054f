"""Children of a SpecDeployment, rendered as plain dicts by pure functions.

The engine's settings live in a ConfigMap mounted into every pod. The engine watches
that file but reloads only the run-time part of its speculation section (threshold,
hysteresis, exploration and its lease), so the pod template carries a hash of everything
else: a new model, draft, method, k, SLO or batch limit rolls the Deployment, a new threshold
does not.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from spectune.operator.models import SpecDeploymentSpec

CONFIG_DIR = "/etc/spectune"
CONFIG_FILE = "engine.yaml"
TOKEN_DIR = "/var/run/spectune"
TOKEN_KEY = "admin-token"
ENGINE_LABEL = "spectune-engine"
GPU_RESOURCE = "nvidia.com/gpu"
CONFIG_HASH_ANNOTATION = "spectune.io/start-config-hash"
# The engine applies these from its watched config file without a restart.
RELOADED_SPECULATION = frozenset({"threshold", "hysteresis", "exploration", "lease"})


INSTANCE_LABEL = "app.kubernetes.io/instance"


def labels(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": ENGINE_LABEL,
        INSTANCE_LABEL: name,
        "app.kubernetes.io/managed-by": "spectune-operator",
    }


def selector(name: str) -> dict[str, str]:
    """The stable subset of labels that selects an instance's pods."""
    return {k: v for k, v in labels(name).items() if k != "app.kubernetes.io/managed-by"}


def selector_string(name: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector(name).items())


def child_names(name: str) -> dict[str, str]:
    return {
        "config": f"{name}-engine-config",
        "token": f"{name}-admin-token",
        "service": name,
        "deployment": name,
    }


def engine_config(
    spec: SpecDeploymentSpec,
    threshold: int | None,
    exploration_percent: int,
    lease: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The engine's settings file (see engine/serving/settings.py for its schema); `lease`:
    raised exploration until a unix time (`speculation.lease`)."""
    s = spec.speculation
    config: dict[str, Any] = {
        "model": spec.model.name,
        "method": s.method,
        "speculation": {
            "k": s.numSpeculativeTokens,
            "threshold": threshold,
            "exploration": exploration_percent / 100,
            **({"lease": dict(lease)} if lease else {}),
        },
        "slo": {"ttft_ms": spec.slo.ttftMilliseconds, "tpot_ms": spec.slo.tpotMilliseconds},
        "max_batch_size": spec.engine.maxBatchSize,
        "port": spec.engine.port,
    }
    if s.draft:
        config["draft"] = s.draft
    if spec.model.dtype:
        config["dtype"] = spec.model.dtype
    return config


def start_config_hash(config: dict[str, Any]) -> str:
    """A hash of the settings the engine reads only at start: it changes, and so rolls the
    pods, exactly when a running engine could not take the new config file as it is."""
    speculation = config.get("speculation") or {}
    fixed = config | {
        "speculation": {k: v for k, v in speculation.items() if k not in RELOADED_SPECULATION}
    }
    return hashlib.sha256(json.dumps(fixed, sort_keys=True).encode()).hexdigest()[:16]


def config_map(name: str, namespace: str, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": child_names(name)["config"],
            "namespace": namespace,
            "labels": labels(name),
        },
        "data": {CONFIG_FILE: yaml.safe_dump(config, sort_keys=True)},
    }


def token_secret(name: str, namespace: str, token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": child_names(name)["token"],
            "namespace": namespace,
            "labels": labels(name),
        },
        "stringData": {TOKEN_KEY: token},
    }


def _resources(spec: SpecDeploymentSpec) -> dict[str, Any]:
    requests = {k: str(v) for k, v in spec.engine.resources.requests.items()}
    limits = {k: str(v) for k, v in spec.engine.resources.limits.items()}
    if spec.engine.gpus:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(spec.engine.gpus)
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def _probe(path: str, port: int, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "failureThreshold": failures,
    }


def deployment(
    name: str,
    namespace: str,
    spec: SpecDeploymentSpec,
    config: dict[str, Any],
    scrape_annotations: bool = True,
) -> dict[str, Any]:
    """The engine Deployment; `config` is the engine_config() its ConfigMap carries. Its pods
    carry the prometheus.io/* annotations that annotation discovery scrapes by only with
    `scrape_annotations`: where a PodMonitor scrapes them too, they would be scraped twice."""
    port = spec.engine.port
    names = child_names(name)
    container = {
        "name": "engine",
        "image": spec.engine.image,
        "command": ["spectune-engine"],
        "args": [
            "serve",
            "--config",
            f"{CONFIG_DIR}/{CONFIG_FILE}",
            "--admin-token-file",
            f"{TOKEN_DIR}/{TOKEN_KEY}",
            "--host",
            "0.0.0.0",
            "--port",
            str(port),
        ],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "resources": _resources(spec),
        "readinessProbe": _probe("/readyz", port, 5, 3),
        "livenessProbe": _probe("/healthz", port, 10, 6),
        "startupProbe": _probe("/healthz", port, 5, 60),
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "admin-token", "mountPath": TOKEN_DIR, "readOnly": True},
        ],
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "terminationGracePeriodSeconds": 60,
        "volumes": [
            {"name": "config", "configMap": {"name": names["config"]}},
            {"name": "admin-token", "secret": {"secretName": names["token"]}},
        ],
    }
    if spec.engine.nodeSelector:
        pod_spec["nodeSelector"] = dict(spec.engine.nodeSelector)
    ours = {CONFIG_HASH_ANNOTATION: start_config_hash(config)}
    if scrape_annotations:
        ours |= {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(port),
            "prometheus.io/path": "/metrics",
        }
    annotations = spec.engine.podAnnotations | ours  # ours win: scraping and rollouts rely on them
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": names["deployment"], "namespace": namespace, "labels": labels(name)},
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": selector(name)},
            "template": {
                "metadata": {"labels": labels(name), "annotations": annotations},
                "spec": pod_spec,
            },
        },
    }


def service(name: str, namespace: str, spec: SpecDeploymentSpec) -> dict[str, Any]:
    port = spec.engine.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": child_names(name)["service"],
            "namespace": namespace,
            "labels": labels(name),
        },
        "spec": {
            "selector": selector(name),
            "ports": [{"name": "http", "port": port, "targetPort": "http"}],
        },
    }


@dataclass(frozen=True)
class PodMonitorSettings:
    """What the operator's PodMonitors carry besides the selector: the scrape interval (15 s:
    the default 120 s calibration window then holds the 8 scrapes the operator asks of it;
    Prometheus's usual 30 s would give 4) and the labels a Prometheus selects PodMonitors by
    (kube-prometheus-stack's: `release: <its release>`; without them it scrapes nothing)."""

    interval: str = "15s"
    labels: Mapping[str, str] = field(default_factory=dict)


DEFAULT_POD_MONITOR = PodMonitorSettings()


def pod_monitor(
    name: str, namespace: str, settings: PodMonitorSettings = DEFAULT_POD_MONITOR
) -> dict[str, Any]:
    """One scrape of every engine of the SpecDeployment. The pod's instance label becomes a
    target label (`app_kubernetes_io_instance`): the operator's queries select by it, and the
    Prometheus Operator adds only namespace, pod, container and job by itself."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**settings.labels, **labels(name)},
        },
        "spec": {
            "selector": {"matchLabels": selector(name)},
            "podTargetLabels": [INSTANCE_LABEL],
            "podMetricsEndpoints": [
                {"port": "http", "path": "/metrics", "interval": settings.interval}
            ],
        },
    }
