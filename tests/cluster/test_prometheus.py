"""A real engine behind a fake pod, found by Prometheus' Kubernetes pod discovery and scraped at
the pod's loopback IP, as in a cluster; and the network rule: every node address, pod IP and
scrape target here is in 127.0.0.0/8."""

from __future__ import annotations

import re
import socket
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.support import ENGINE_LABEL, Cluster, is_loopback, our_processes
from tests.support.waiting import wait_until

pytestmark = pytest.mark.cluster

PORT = 8000


@pytest.fixture(scope="module")
def engine_pod(cluster: Cluster, tiny_pair: tuple[Path, Path]) -> Iterator[Any]:
    """A one-replica engine Deployment on an H100 node, once its pod is Running."""
    ns = f"engine-{uuid.uuid4().hex[:8]}"
    labels = {**ENGINE_LABEL, "app.kubernetes.io/instance": "scrape-test"}
    deployment = {
        "metadata": {"name": "engine", "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(PORT),
                    },
                },
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                    "containers": [
                        {
                            "name": "engine",
                            "image": "ghcr.io/spectune/spectune-engine:dev",
                            "args": ["--model", "tiny-target", "--method", "ngram",
                                     "--device", "cpu"],
                            "ports": [{"name": "http", "containerPort": PORT}],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }  # fmt: skip
    with cluster.api() as api:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        apps.create_namespaced_deployment(ns, deployment)

        def running() -> Any:
            pods = core.list_namespaced_pod(ns, label_selector="app.kubernetes.io/instance").items
            return next((p for p in pods if p.status.phase == "Running" and p.status.pod_ip), None)

        pod = wait_until("the engine pod to run", running)
        yield pod
        core.delete_namespace(ns)


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        return bytes(r.read())


def test_a_real_engine_serves_at_the_pod_ip(engine_pod: Any) -> None:
    base = f"http://{engine_pod.status.pod_ip}:{PORT}"
    wait_until("the engine to be ready", lambda: get(f"{base}/readyz"), timeout=180)
    assert b"spectune_engine_info" in get(f"{base}/metrics")


def test_prometheus_discovers_and_scrapes_the_engine(cluster: Cluster, engine_pod: Any) -> None:
    name, ip = engine_pod.metadata.name, engine_pod.status.pod_ip

    def target_up() -> Any:
        targets = cluster.prometheus("/api/v1/targets", state="active")["activeTargets"]
        mine = [t for t in targets if t["labels"].get("pod") == name]
        return mine if mine and all(t["health"] == "up" for t in mine) else None

    (target,) = wait_until("Prometheus to scrape the engine pod", target_up, timeout=180)
    assert target["scrapeUrl"] == f"http://{ip}:{PORT}/metrics"
    assert target["discoveredLabels"]["__meta_kubernetes_pod_node_name"].startswith("gpu-h100-")

    series = wait_until(
        "spectune_ metrics in Prometheus",
        lambda: cluster.prometheus(
            "/api/v1/query", query=f'{{__name__=~"spectune_.+", pod="{name}"}}'
        )["result"],
    )
    names = {s["metric"]["__name__"] for s in series}
    assert "spectune_engine_info" in names, sorted(names)


def test_every_address_is_loopback(cluster: Cluster, engine_pod: Any) -> None:
    with cluster.api() as api:
        core = client.CoreV1Api(api)
        nodes = core.list_node().items
        pods = core.list_pod_for_all_namespaces().items
    assert nodes
    for node in nodes:
        for address in node.status.addresses or []:
            if address.type != "Hostname":
                assert is_loopback(address.address), (node.metadata.name, address)
    assert pods
    for pod in pods:
        ips = [ip.ip for ip in pod.status.pod_ips or []] + [pod.status.host_ip]
        for ip in filter(None, ips):
            assert is_loopback(ip), (pod.metadata.namespace, pod.metadata.name, ip)
    data = cluster.prometheus("/api/v1/targets")
    assert data["activeTargets"]
    for target in data["activeTargets"]:
        host = target["scrapeUrl"].split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[0]
        assert is_loopback(host), target["scrapeUrl"]
    for target in data["droppedTargets"]:
        # Pods without an IP yet are dropped with an empty host; none may point elsewhere.
        host = target["discoveredLabels"].get("__address__", "").rsplit(":", 1)[0]
        assert not host or is_loopback(host), target["discoveredLabels"]
    assert is_loopback(cluster.prometheus_url.split("//")[1].rsplit(":", 1)[0])


def host_of(address: str) -> str:
    """`127.0.0.1:80`, `[::ffff:127.0.0.1]:80` or `*:*` -> the bare host."""
    host = address.rsplit(":", 1)[0].strip("[]").split("%")[0]
    return host.removeprefix("::ffff:")


def test_every_socket_of_the_cluster_is_on_loopback(engine_pod: Any) -> None:
    """What the processes of the cluster (engines included) really bind and connect to."""
    pids = {pid for pid, _ in our_processes()}
    lines = subprocess.run(
        ["ss", "-Htuanp"], check=True, capture_output=True, text=True
    ).stdout.splitlines()
    seen = 0
    for line in lines:
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if not owners & pids:
            continue
        fields = line.split()
        local, peer = fields[4], fields[5]
        assert is_loopback(host_of(local)), line
        assert host_of(peer) in {"*", "0.0.0.0", "::"} or is_loopback(host_of(peer)), line
        seen += 1
    assert seen, "no socket of the cluster's processes was found"


def test_the_engine_stops_when_its_pod_goes_away(cluster: Cluster, engine_pod: Any) -> None:
    with cluster.api() as api:
        client.AppsV1Api(api).patch_namespaced_deployment_scale(
            "engine", engine_pod.metadata.namespace, {"spec": {"replicas": 0}}
        )

    def port_closed() -> bool:
        with socket.socket() as s:
            s.settimeout(1)
            return s.connect_ex((engine_pod.status.pod_ip, PORT)) != 0

    wait_until("the pod runner to stop the engine", port_closed, timeout=60)
