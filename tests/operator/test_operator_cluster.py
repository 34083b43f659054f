"""The operator against the real local API server: create, scale, drift repair, GC,
admission of invalid specs, printer columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from spectune.operator import render
from tests.cluster.support import REPO, wait_until

from .conftest import (
    GROUP,
    PLURAL,
    VERSION,
    _get,
    create,
    get_sd,
    kubectl,
    sd,
)

pytestmark = pytest.mark.cluster
POD_MONITOR_CRD = Path(__file__).parent / "podmonitor-crd.yaml"


def test_create_gives_children_status_and_events(cluster, admin, operator, namespace) -> None:
    create(admin, namespace, sd("llm"))
    apps, core = client.AppsV1Api(admin), client.CoreV1Api(admin)
    deployment = wait_until(
        "the engine Deployment", lambda: _get(apps.read_namespaced_deployment, "llm", namespace)
    )
    assert deployment.spec.replicas == 2
    container = deployment.spec.template.spec.containers[0]
    assert container.resources.limits["nvidia.com/gpu"] == "1"
    assert deployment.metadata.owner_references[0].kind == "SpecDeployment"
    config = core.read_namespaced_config_map("llm-engine-config", namespace)
    assert yaml.safe_load(config.data["engine.yaml"])["speculation"]["threshold"] == 6
    assert core.read_namespaced_service("llm", namespace).metadata.owner_references
    assert core.read_namespaced_secret("llm-admin-token", namespace).data["admin-token"]

    def ready() -> dict | None:
        status = get_sd(admin, namespace, "llm").get("status", {})
        return status if status.get("readyReplicas") == 2 else None

    status = wait_until("2 ready replicas in status", ready, timeout=180)
    assert status["threshold"]["current"] == 6 and status["threshold"]["source"] == "Spec"
    assert status["selector"].startswith("app.kubernetes.io/name=spectune-engine")
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "True"
    events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=llm").items
    assert any(e.reason == "Created" for e in events)
    table = kubectl(cluster, "get", "sd", "llm", "-n", namespace)
    header, row = table.splitlines()[:2]
    assert header.split() == [
        "NAME",
        "REPLICAS",
        "READY",
        "THRESHOLD",
        "CROSSOVER",
        "GOODPUT",
        "AGE",
    ]
    assert row.split()[:4] == ["llm", "2", "2", "6"]


def test_scale_and_drift_repair(cluster, admin, operator, namespace) -> None:
    create(admin, namespace, sd("llm"))
    apps, core = client.AppsV1Api(admin), client.CoreV1Api(admin)
    wait_until("the Deployment", lambda: _get(apps.read_namespaced_deployment, "llm", namespace))
    kubectl(cluster, "scale", "sd/llm", "--replicas", "3", "-n", namespace)
    wait_until(
        "3 replicas", lambda: apps.read_namespaced_deployment("llm", namespace).spec.replicas == 3
    )

    apps.patch_namespaced_deployment("llm", namespace, {"spec": {"replicas": 7}})
    wait_until(
        "replicas repaired to 3",
        lambda: apps.read_namespaced_deployment("llm", namespace).spec.replicas == 3,
    )
    core.delete_namespaced_config_map("llm-engine-config", namespace)
    wait_until(
        "the ConfigMap recreated",
        lambda: _get(core.read_namespaced_config_map, "llm-engine-config", namespace),
    )


def test_delete_garbage_collects_children(admin, operator, namespace) -> None:
    create(admin, namespace, sd("llm"))
    apps = client.AppsV1Api(admin)
    wait_until("the Deployment", lambda: _get(apps.read_namespaced_deployment, "llm", namespace))
    client.CustomObjectsApi(admin).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "llm"
    )
    wait_until(
        "the Deployment garbage-collected",
        lambda: _get(apps.read_namespaced_deployment, "llm", namespace) is None,
        timeout=120,
    )
    wait_until(
        "the ConfigMap garbage-collected",
        lambda: (
            _get(client.CoreV1Api(admin).read_namespaced_config_map, "llm-engine-config", namespace)
            is None
        ),
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"speculation": {"threshold": {"min": 10, "max": 4}}},
            "threshold.min must not exceed threshold.max",
        ),
        ({"speculation": {"numSpeculativeTokens": 0}}, "numSpeculativeTokens"),
        ({"speculation": {"method": "medusa"}}, 'Unsupported value: "medusa"'),
        ({"replicas": -1}, "spec.replicas"),
        ({"slo": {"ttftMilliseconds": 0}}, "ttftMilliseconds"),
        (
            {"speculation": {"method": "draft"}},
            "speculation.draft is required when method is draft",
        ),
        (
            {"speculation": {"threshold": {"mode": "Manual"}}},
            "threshold.value is required in Manual mode",
        ),
        ({"model": {}}, "spec.model.name: Required value"),
    ],
)
def test_invalid_specdeployments_are_rejected(admin, namespace, spec: dict, message: str) -> None:
    with pytest.raises(ApiException) as err:
        create(admin, namespace, sd("bad", **spec))
    assert err.value.status == 422
    assert message in json.loads(err.value.body)["message"]


def test_the_example_becomes_ready(cluster, admin, operator, namespace) -> None:
    kubectl(cluster, "apply", "-n", namespace, "-f", str(REPO / "examples" / "specdeployment.yaml"))

    def ready() -> bool:
        status = get_sd(admin, namespace, "tiny").get("status", {})
        return any(
            c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])
        )

    wait_until("the example to be Ready", ready, timeout=180)
    pods = client.CoreV1Api(admin).list_namespaced_pod(
        namespace, label_selector=render.selector_string("tiny")
    )
    assert {p.spec.node_name for p in pods.items} <= {
        "gpu-h100-0",
        "gpu-h100-1",
    }  # its nodeSelector


def test_pod_monitor_is_rendered_when_the_prometheus_operator_crd_exists(
    cluster, admin, operator, namespace
) -> None:
    kubectl(cluster, "apply", "--server-side", "-f", str(POD_MONITOR_CRD))
    create(admin, namespace, sd("llm"))
    custom = client.CustomObjectsApi(admin)
    wait_until(
        "the PodMonitor",
        lambda: _get(
            lambda n, ns: custom.get_namespaced_custom_object(
                "monitoring.coreos.com", "v1", ns, "podmonitors", n
            ),
            "llm",
            namespace,
        ),
    )
