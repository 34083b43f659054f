"""The pod runner gives an engine what the kubelet would: ConfigMap and Secret volumes as files
at the paths its arguments name, kept in step with the objects (the engine watches its config
file), and `env`; and it reports the engine's readiness in the pod's status, so the pod is
Ready only once its engine answers /readyz, and says why not when the engine exits. The
operator configures engines exactly this way."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.support import ENGINE_LABEL, Cluster
from tests.support.waiting import wait_until

pytestmark = pytest.mark.cluster

PORT = 8100
# Engines listen on loopback pod IPs: never through a proxy.
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))
TOKEN = "s3cret-admin-token"


def config_map(threshold: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "engine-config"},
        "data": {"engine.yaml": f"speculation:\n  k: 4\n  threshold: {threshold}\n"},
    }


@pytest.fixture(scope="module")
def configured_engine(cluster: Cluster, tiny_pair: tuple[Path, Path]) -> Iterator[tuple[str, Any]]:
    """(namespace, Running pod) of an engine configured through a ConfigMap and a Secret."""
    ns = f"runner-{uuid.uuid4().hex[:8]}"
    labels = {**ENGINE_LABEL, "app.kubernetes.io/instance": "configured"}
    deployment = {
        "metadata": {"name": "engine"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "volumes": [
                        {"name": "config", "configMap": {"name": "engine-config"}},
                        {"name": "admin", "secret": {"secretName": "engine-admin",
                                                     "items": [{"key": "t", "path": "token"}]}},
                    ],
                    "containers": [{
                        "name": "engine",
                        "image": "ghcr.io/spectune/spectune-engine:dev",
                        "command": ["spectune-engine", "serve"],
                        "args": ["--config", "/etc/spectune/engine.yaml",
                                 "--admin-token-file", "/var/run/spectune/token",
                                 "--device", "cpu", "--host", "0.0.0.0", "--port", "1"],
                        "env": [{"name": "SPECTUNE_MODEL", "value": "tiny-target"},
                                {"name": "SPECTUNE_METHOD", "valueFrom": {"configMapKeyRef": {
                                    "name": "engine-env", "key": "method"}}}],
                        "ports": [{"name": "http", "containerPort": PORT}],
                        "volumeMounts": [
                            {"name": "config", "mountPath": "/etc/spectune"},
                            {"name": "admin", "mountPath": "/var/run/spectune", "readOnly": True},
                        ],
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }],
                },
            },
        },
    }  # fmt: skip
    with cluster.api() as api:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        core.create_namespaced_config_map(ns, config_map(5))
        core.create_namespaced_config_map(
            ns, {"metadata": {"name": "engine-env"}, "data": {"method": "ngram"}}
        )
        core.create_namespaced_secret(
            ns, {"metadata": {"name": "engine-admin"}, "stringData": {"t": TOKEN}}
        )
        apps.create_namespaced_deployment(ns, deployment)

        def running() -> Any:
            pods = core.list_namespaced_pod(ns).items
            return next((p for p in pods if p.status.phase == "Running" and p.status.pod_ip), None)

        pod = wait_until("the engine pod to run", running)
        yield ns, pod
        core.delete_namespace(ns)


def speculation(base: str, body: dict[str, Any] | None = None, token: str = TOKEN) -> Any:
    request = urllib.request.Request(
        f"{base}/admin/speculation",
        data=None if body is None else json.dumps(body).encode(),
        method="GET" if body is None else "PUT",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with HTTP.open(request, timeout=5) as r:
        return json.load(r)


def ready_condition(pod: Any) -> Any:
    return next((c for c in pod.status.conditions or [] if c.type == "Ready"), None)


def test_config_secret_and_env_reach_the_engine(
    cluster: Cluster, configured_engine: tuple[str, Any]
) -> None:
    ns, pod = configured_engine
    base = f"http://{pod.status.pod_ip}:{PORT}"
    wait_until("the engine to be ready", lambda: speculation(base), timeout=180)

    def pod_ready() -> Any:
        with cluster.api() as api:
            live = client.CoreV1Api(api).read_namespaced_pod(pod.metadata.name, ns)
        return live if ready_condition(live).status == "True" else None

    live = wait_until("the pod to be Ready", pod_ready)
    assert live.status.container_statuses[0].ready
    with HTTP.open(f"{base}/readyz", timeout=5) as r:
        assert r.status == 200
    state = speculation(base)
    assert json.dumps(state).count('"threshold": 5') >= 1, state

    with HTTP.open(f"{base}/metrics", timeout=5) as r:
        metrics = r.read().decode()
    info = next(line for line in metrics.splitlines() if line.startswith("spectune_engine_info"))
    assert 'model="tiny-target"' in info, info

    with pytest.raises(urllib.error.HTTPError) as wrong:
        speculation(base, {"k": 3}, token="wrong")
    assert wrong.value.code == 401
    assert '"k": 3' in json.dumps(speculation(base, {"k": 3}))


def test_a_changed_config_map_reaches_the_running_engine(
    cluster: Cluster, configured_engine: tuple[str, Any]
) -> None:
    ns, pod = configured_engine
    base = f"http://{pod.status.pod_ip}:{PORT}"
    wait_until("the engine to be ready", lambda: speculation(base), timeout=180)
    with cluster.api() as api:
        client.CoreV1Api(api).replace_namespaced_config_map("engine-config", ns, config_map(7))
    wait_until(
        "the engine to load threshold 7",
        lambda: '"threshold": 7' in json.dumps(speculation(base)),
        timeout=60,
    )


def test_a_pod_whose_engine_exits_is_not_ready_and_says_why(
    cluster: Cluster, configured_engine: tuple[str, Any]
) -> None:
    ns, _ = configured_engine
    labels = {**ENGINE_LABEL, "app.kubernetes.io/instance": "crashing"}
    pod = {
        "metadata": {"name": "crashing", "labels": labels},
        "spec": {
            "containers": [{
                "name": "engine",
                "image": "ghcr.io/spectune/spectune-engine:dev",
                "args": ["--k", "0"],  # the engine refuses it and exits
                "ports": [{"name": "http", "containerPort": PORT}],
            }],
        },
    }  # fmt: skip
    with cluster.api() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(ns, pod)

        def crash_looping() -> Any:
            live = core.read_namespaced_pod("crashing", ns)
            ready = ready_condition(live)
            statuses = live.status.container_statuses or []
            restarted = bool(statuses) and statuses[0].restart_count >= 2
            return ready if ready and ready.reason == "EngineExited" and restarted else None

        ready = wait_until("the pod to say its engine exits", crash_looping, timeout=120)
        assert ready.status == "False"
        assert ready.message.startswith("engine exited with code 2: spectune-engine: error:")
        assert "speculation.k" in ready.message
        (status,) = core.read_namespaced_pod("crashing", ns).status.container_statuses
        assert not status.ready
