"""Children of a SpecDeployment, rendered as plain dicts by pure functions.

The engine's settings live in a ConfigMap mounted into every pod. The engine watches
that file but reloads only the run-time part of its speculation section (threshold, per-SKU
thresholds, hysteresis, exploration and its lease), so the pod template carries a hash of
everything else: a new model, draft, method, k, SLO or batch limit rolls the Deployment, a new
threshold does not.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

import yaml

from spectune.operator.models import (
    GPU_RESOURCE,
    OWN_MOUNT_PATHS,
    OWN_VOLUMES,
    EngineSpec,
    PodTemplate,
    SpecDeploymentSpec,
)

CONFIG_DIR, TOKEN_DIR, MODEL_DIR, DRAFT_DIR = OWN_MOUNT_PATHS
CONFIG_VOLUME, TOKEN_VOLUME, MODEL_VOLUME, DRAFT_VOLUME = OWN_VOLUMES
CONFIG_FILE = "engine.yaml"
TOKEN_KEY = "admin-token"
ENGINE_LABEL = "spectune-engine"
# The engine image an empty spec.engine.image runs: the operator's --engine-image, which the
# chart sets from its engine.image value.
ENGINE_IMAGE = f"ghcr.io/spectune/spectune-engine:{version('spectune')}"
# Pod Security "restricted"; a template's securityContext is merged over these. No UID, GID or
# fsGroup: the image's user (10001:10001) runs where the platform assigns none, and where it
# does (OpenShift's restricted SCC, from the namespace's range) a fixed one would be refused.
POD_SECURITY = {
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
# Where the engine writes, with a read-only root: /tmp (its HOME: Inductor's and Triton's
# compile caches), /cache (the image's SPECTUNE_CACHE: built-in models) and /dev/shm (a
# container runtime's default is 64 MiB). Defaults: a template may resize or replace them.
SCRATCH_VOLUMES = (
    ("tmp", "/tmp", {}),
    ("cache", "/cache", {}),
    ("shm", "/dev/shm", {"medium": "Memory"}),
)
# Requests for cpu and memory where spec.engine.resources names neither (so Burstable): a GPU
# engine's host side (CUDA context, loading the weights, the server) and the CPU engine's.
GPU_ENGINE_REQUESTS: dict[str, int | str] = {"cpu": "2", "memory": "16Gi"}
CPU_ENGINE_REQUESTS: dict[str, int | str] = {"cpu": "1", "memory": "2Gi"}
# A strategic merge patch's merge keys for the lists a pod template fragment can hold; other
# lists (tolerations, envFrom) are replaced whole.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
}
# A stopping engine keeps serving this long before it is sent SIGTERM: the time endpoints,
# kube-proxy and ingresses take to stop routing to it (a request routed in that window would
# otherwise be refused). Then the server stops accepting and finishes what it holds (its
# drain, 30 s by default) within the grace period. A sleep action: no binary in the image.
PRE_STOP_SECONDS = 10
TERMINATION_GRACE_SECONDS = 60
CONFIG_HASH_ANNOTATION = "spectune.io/start-config-hash"
# The engine applies these from its watched config file without a restart.
RELOADED_SPECULATION = frozenset({"threshold", "thresholds", "hysteresis", "exploration", "lease"})


INSTANCE_LABEL = "app.kubernetes.io/instance"


MANAGED_BY_LABEL, MANAGED_BY = "app.kubernetes.io/managed-by", "spectune-operator"


def labels(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": ENGINE_LABEL,
        INSTANCE_LABEL: name,
        MANAGED_BY_LABEL: MANAGED_BY,
    }


def selector(name: str) -> dict[str, str]:
    """The stable subset of labels that selects an instance's pods."""
    return {k: v for k, v in labels(name).items() if k != MANAGED_BY_LABEL}


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
    thresholds: Mapping[str, int | None] | None = None,
) -> dict[str, Any]:
    """The engine's settings file (see engine/serving/settings.py for its schema): what every
    engine runs durably. `thresholds`: per GPU product, the threshold its engines run instead of
    `threshold` (each engine picks its own). Raised exploration is not here: it is leased to
    the scraped engines through the admin API alone."""
    s = spec.speculation
    model, draft = weights(spec)
    config: dict[str, Any] = {
        "model": model,
        "method": s.method,
        "speculation": {
            "k": s.numSpeculativeTokens,
            "threshold": threshold,
            "thresholds": dict(thresholds or {}),
            "exploration": exploration_percent / 100,
        },
        "slo": {"ttft_ms": spec.slo.ttftMilliseconds, "tpot_ms": spec.slo.tpotMilliseconds},
        "max_batch_size": spec.engine.maxBatchSize,
        "port": spec.engine.port,
    }
    if draft:
        config["draft"] = draft
    if spec.model.volume:  # clients ask for the model by its name, not its mount path
        config["served_model_name"] = spec.model.name
    if spec.model.dtype:
        config["dtype"] = spec.model.dtype
    if spec.engine.gpus:
        config["device"] = "cuda"  # never the CPU silently while holding a GPU
    return config


def weights(spec: SpecDeploymentSpec) -> tuple[str, str | None]:
    """Where the engine reads the target and the draft: inside their volumes' mounts when
    they come from volumes, else as named (a directory in the image, a built-in name)."""
    model = spec.model.name
    if spec.model.volume:
        model = f"{MODEL_DIR}/{model}"
    draft = spec.speculation.draft
    if draft and spec.speculation.draftVolume:
        draft = f"{DRAFT_DIR}/{draft}"
    return model, draft


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


def _resources(
    requests: Mapping[str, int | str], limits: Mapping[str, int | str]
) -> dict[str, dict[str, str]]:
    out = {"requests": {k: str(v) for k, v in requests.items()}}
    out["limits"] = {k: str(v) for k, v in limits.items()}
    return {k: v for k, v in out.items() if v}


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
    default_image: str = ENGINE_IMAGE,
) -> dict[str, Any]:
    """The engine Deployment; `config` is the engine_config() its ConfigMap carries. Its pods
    carry the prometheus.io/* annotations that annotation discovery scrapes by only with
    `scrape_annotations`: where a PodMonitor scrapes them too, they would be scraped twice.
    The pod is the defaults, spec.engine.template merged over them, then the operator's own
    fields over both (the CRD refuses a template that contradicts those)."""
    port = spec.engine.port
    ours = {CONFIG_HASH_ANNOTATION: start_config_hash(config)}
    if scrape_annotations:
        ours |= {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(port),
            "prometheus.io/path": "/metrics",
        }
    template = strategic_merge(
        strategic_merge(_pod_defaults(spec), fragment(spec.engine.template)),
        _pod_own(name, spec, config, ours, default_image),
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": child_names(name)["deployment"],
            "namespace": namespace,
            "labels": labels(name),
        },
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": selector(name)},
            "strategy": _strategy(spec.engine),
            "template": template,
        },
    }


def _strategy(engine: EngineSpec) -> dict[str, Any]:
    """The Deployment's strategy from spec.engine.strategy (models.Strategy says why GPU pods
    default to one at a time, never one more than replicas)."""
    strategy = engine.strategy
    if strategy.type == "Recreate":
        return {"type": "Recreate"}
    given = strategy.model_dump(include={"maxSurge", "maxUnavailable"}, exclude_none=True)
    rolling = ({"maxSurge": 0, "maxUnavailable": 1} if engine.gpus else {}) | given
    return {"type": "RollingUpdate", **({"rollingUpdate": rolling} if rolling else {})}


def _requests(engine: EngineSpec) -> dict[str, int | str]:
    """spec.engine.resources.requests over a default for each of cpu and memory that is
    neither requested nor limited there: an engine with no requests would be BestEffort (GPUs
    do not count for QoS), the first pod evicted, holding gigabytes of weights."""
    given = engine.resources
    default = GPU_ENGINE_REQUESTS if engine.gpus else CPU_ENGINE_REQUESTS
    return {k: v for k, v in default.items() if k not in given.limits} | given.requests


def _pod_defaults(spec: SpecDeploymentSpec) -> dict[str, Any]:
    """What a template may change: security contexts, resources, node selection, scratch
    volumes, the preStop and the grace period."""
    container = {
        "name": "engine",
        "securityContext": CONTAINER_SECURITY,
        "resources": _resources(_requests(spec.engine), spec.engine.resources.limits),
        "volumeMounts": [{"name": name, "mountPath": path} for name, path, _ in SCRATCH_VOLUMES],
    }
    given = spec.engine.template.spec.containers
    if not (given and given[0].lifecycle):  # a template's lifecycle replaces it, not merged
        container["lifecycle"] = {"preStop": {"sleep": {"seconds": PRE_STOP_SECONDS}}}
    pod: dict[str, Any] = {
        "containers": [container],
        "securityContext": POD_SECURITY,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "volumes": [{"name": name, "emptyDir": source} for name, _, source in SCRATCH_VOLUMES],
    }
    if spec.engine.nodeSelector:
        pod["nodeSelector"] = dict(spec.engine.nodeSelector)
    return {"metadata": {"annotations": dict(spec.engine.podAnnotations)}, "spec": pod}


def _pod_own(
    name: str,
    spec: SpecDeploymentSpec,
    config: dict[str, Any],
    annotations: dict[str, str],
    default_image: str,
) -> dict[str, Any]:
    """The operator's fields of the pod: what it runs, how it is reached and configured."""
    port = spec.engine.port
    names = child_names(name)
    args = [
        "serve",
        "--config",
        f"{CONFIG_DIR}/{CONFIG_FILE}",
        "--admin-token-file",
        f"{TOKEN_DIR}/{TOKEN_KEY}",
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
    ]
    mounts = [
        {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True},
    ]
    volumes = [
        {"name": CONFIG_VOLUME, "configMap": {"name": names["config"]}},
        {"name": TOKEN_VOLUME, "secret": {"secretName": names["token"]}},
    ]
    # Weights from volumes, read-only. Their paths are arguments too (the config file holds
    # the same): a runtime that maps mount paths, as the local cluster's pod runner does,
    # rewrites arguments, not files.
    for flag, volume, mount, source, path in (
        ("--model", MODEL_VOLUME, MODEL_DIR, spec.model.volume, config["model"]),
        ("--draft", DRAFT_VOLUME, DRAFT_DIR, spec.speculation.draftVolume, config.get("draft")),
    ):
        if source and path:
            args += [flag, path]
            mounts.append({"name": volume, "mountPath": mount, "readOnly": True})
            volumes.append({"name": volume, **_read_only(source)})
    gpus = {GPU_RESOURCE: str(spec.engine.gpus)} if spec.engine.gpus else {}
    container = {
        "name": "engine",
        "image": spec.engine.image or default_image,
        "command": ["spectune-engine"],
        "args": args,
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "resources": _resources(gpus, gpus),
        "readinessProbe": _probe("/readyz", port, 5, 3),
        "livenessProbe": _probe("/healthz", port, 10, 6),
        # Ready comes after loading the weights and the warm-up (every batch bucket's graphs and
        # compiles): up to 20 minutes for an 8B model on a GPU before the kubelet restarts it;
        # liveness starts only then, so a load that hangs is restarted too.
        "startupProbe": _probe("/readyz", port, 10, 120),
        # A crashed engine's last line (CUDA unusable, weights missing) in the pod's status.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
    }
    return {
        "metadata": {"labels": labels(name), "annotations": annotations},
        "spec": {"containers": [container], "volumes": volumes},
    }


def _read_only(source: Mapping[str, Any]) -> dict[str, Any]:
    """A volume source as the pod mounts it: a claim read-only as well as its mount."""
    claim = source.get("persistentVolumeClaim")
    if isinstance(claim, dict):
        return {**source, "persistentVolumeClaim": {**claim, "readOnly": True}}
    return dict(source)


def fragment(template: PodTemplate) -> dict[str, Any]:
    """The template as a patch: unset fields and empty sections left out, so they change
    nothing."""
    return _prune(template.model_dump(exclude_none=True))


def _prune(value: Any) -> Any:
    if isinstance(value, dict):
        kept = {k: _prune(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v not in ({}, [], None)}
    if isinstance(value, list):
        return [_prune(v) for v in value]
    return value


def strategic_merge(base: Any, patch: Any, key: str | None = None) -> Any:
    """`patch` over `base` as a strategic merge patch does it: maps key by key, the lists in
    MERGE_KEYS item by item on their merge key, anything else replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = strategic_merge(base[k], v, k) if k in base else v
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        field_name = MERGE_KEYS[key]
        out_list = list(base)
        where = {item.get(field_name): i for i, item in enumerate(out_list)}
        for item in patch:
            i = where.get(item.get(field_name))
            if i is None:
                out_list.append(item)
            else:
                out_list[i] = strategic_merge(out_list[i], item)
        return out_list
    return patch


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
    """One scrape of every engine of the SpecDeployment. The Prometheus Operator adds
    namespace, pod, container and job by itself (the operator reads by namespace and pod); the
    pod's instance label becomes a target label too (`app_kubernetes_io_instance`), which the
    chart's alerts and dashboard group by."""
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
