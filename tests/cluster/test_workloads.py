"""Deployments that ask for GPUs become Running pods on the fake GPU nodes, through the real
controller manager, scheduler and kwok, with pod IPs inside the nodes' loopback pod CIDRs; and
Services there make no noise (no Endpoints controller warning about those loopback IPs)."""

from __future__ import annotations

import ipaddress
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.support import Cluster, is_loopback
from tests.support.waiting import wait_until

pytestmark = pytest.mark.cluster

SKUS = {"NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB", "NVIDIA-L4"}


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    name = f"gpu-{uuid.uuid4().hex[:8]}"
    with cluster.api() as api:
        core = client.CoreV1Api(api)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        yield name
        core.delete_namespace(name)


def gpu_deployment(
    name: str, replicas: int, gpus: int, node_selector: dict[str, str] | None = None
) -> dict[str, Any]:
    """A Deployment whose pods each request `gpus` nvidia.com/gpu (no engine behind them)."""
    labels = {"app": name}
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": node_selector or {},
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.invalid/none:0",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def running_pods(core: client.CoreV1Api, namespace: str, app: str, n: int) -> list[Any] | None:
    pods = core.list_namespaced_pod(namespace, label_selector=f"app={app}").items
    ok = [p for p in pods if p.status.phase == "Running" and p.status.pod_ip]
    return ok if len(ok) == n else None


def test_gpu_deployment_gets_running_pods_on_fake_gpu_nodes(
    cluster: Cluster, namespace: str
) -> None:
    with cluster.api() as api:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        apps.create_namespaced_deployment(namespace, gpu_deployment("trainer", 3, 4))
        pods = wait_until(
            "3 Running pods", lambda: running_pods(core, namespace, "trainer", 3), timeout=120
        )
        for pod in pods:
            node = core.read_node(pod.spec.node_name)
            assert node.metadata.labels["nvidia.com/gpu.product"] in SKUS
            assert node.status.allocatable["nvidia.com/gpu"] == "8"
            assert is_loopback(pod.status.pod_ip), pod.status.pod_ip
            cidr = ipaddress.ip_network(node.spec.pod_cidr)
            assert ipaddress.ip_address(pod.status.pod_ip) in cidr
            assert is_loopback(pod.status.host_ip), pod.status.host_ip
        assert len({p.status.pod_ip for p in pods}) == 3


def test_gpu_product_selector_picks_the_sku(cluster: Cluster, namespace: str) -> None:
    with cluster.api() as api:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        selector = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}
        apps.create_namespaced_deployment(namespace, gpu_deployment("a100", 1, 1, selector))
        (pod,) = wait_until("an A100 pod", lambda: running_pods(core, namespace, "a100", 1))
        assert pod.spec.node_name == "gpu-a100-0"


def test_more_gpus_than_a_node_has_stay_pending(cluster: Cluster, namespace: str) -> None:
    with cluster.api() as api:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        apps.create_namespaced_deployment(namespace, gpu_deployment("huge", 1, 9))

        def unschedulable() -> bool:
            pods = core.list_namespaced_pod(namespace, label_selector="app=huge").items
            return bool(pods) and any(
                c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
                for c in pods[0].status.conditions or []
            )

        wait_until("the scheduler to report the pod unschedulable", unschedulable)
        (pod,) = core.list_namespaced_pod(namespace, label_selector="app=huge").items
        assert pod.status.phase == "Pending" and not pod.spec.node_name


def test_a_service_over_loopback_pods_raises_no_endpoint_warnings(
    cluster: Cluster, namespace: str
) -> None:
    """The API server refuses loopback endpoint addresses, so Endpoints controllers would warn
    about every Service forever; cluster.sh leaves them off."""
    with cluster.api() as api:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        apps.create_namespaced_deployment(namespace, gpu_deployment("web", 1, 1))
        wait_until("a Running pod", lambda: running_pods(core, namespace, "web", 1))
        service = {
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        }
        core.create_namespaced_service(namespace, service)
        # A barrier instead of a sleep: a second pod behind the Service, made by the same
        # controller manager (deployment and replica-set controllers) from a change after the
        # Service's creation. Once it runs, an Endpoints controller would have had both the
        # Service and a pod change to act on (and, with loopback IPs, to warn about).
        apps.patch_namespaced_deployment_scale("web", namespace, {"spec": {"replicas": 2}})
        wait_until("a second Running pod", lambda: running_pods(core, namespace, "web", 2))
        events = core.list_namespaced_event(namespace).items
        endpoint_events = [
            f"{e.reason}: {e.message}"
            for e in events
            if (e.reason or "").startswith("FailedToUpdateEndpoint")
        ]
        assert endpoint_events == []
        assert core.list_namespaced_endpoints(namespace).items == []
