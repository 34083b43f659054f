"""Helpers for the operator against the real local API server (RBAC on): SpecDeployments, the
operator run as its own ServiceAccount bound to exactly the chart's rules, and what the
engines behind its pods say."""

from __future__ import annotations

import contextlib
import copy
import json
import subprocess
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from spectune.operator import render
from spectune.operator.launch import OperatorProcess, bind_operator, launch
from spectune.operator.leadership import Leases
from spectune.operator.models import GROUP, PLURAL, VERSION
from tests.cluster.support import REPO, Cluster, is_loopback, sa_kubeconfig
from tests.support.waiting import wait_until

RULES = REPO / "charts" / "spectune" / "files" / "operator-rules.yaml"
LEASE_RULES = REPO / "charts" / "spectune" / "files" / "leader-election-rules.yaml"
KUBECTL = REPO / ".local" / "bin" / "kubectl"
OPERATOR_NS = "spectune-system"
H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-40GB"
L4 = "NVIDIA-L4"
PORT = 8000  # the SpecDeployment's default engine port
START = 1  # AUTO's start value: far below any crossover the engines can show
WINDOW = 30  # AUTO's tuning.calibrationWindowSeconds
# Engines listen on loopback pod IPs: never through a proxy.
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))
T = TypeVar("T")

# Two engines on H100 nodes at a pinned threshold: the operator's wiring, no tuning.
MANUAL: dict[str, Any] = {
    "replicas": 2,
    "model": {"name": "tiny-target"},
    "engine": {"gpus": 1, "nodeSelector": {"nvidia.com/gpu.product": H100}},
    "speculation": {"method": "ngram", "threshold": {"mode": "Manual", "value": 6}},
}
# One engine on a simulated H100, tuned: short windows, no dwell, SLOs this CPU meets.
AUTO: dict[str, Any] = {
    "replicas": 1,
    "model": {"name": "tiny-target"},
    "engine": {
        "gpus": 1,
        "nodeSelector": {"nvidia.com/gpu.product": H100},
        "podAnnotations": {"spectune.io/simulate-gpu": "true"},
        "maxBatchSize": 16,
    },
    "speculation": {
        "method": "ngram",
        "threshold": {"mode": "Auto", "value": START, "min": 1, "max": 16},
    },
    "slo": {"ttftMilliseconds": 5000, "tpotMilliseconds": 1000},
    "tuning": {"calibrationWindowSeconds": WINDOW, "minDwellSeconds": 0},
}


def specdeployment(name: str, base: dict[str, Any] = MANUAL, **fields: Any) -> dict[str, Any]:
    """A SpecDeployment named `name`: a copy of `base` (MANUAL or AUTO) with the top-level spec
    `fields` given replaced whole (so a test states exactly the section it means)."""
    spec = copy.deepcopy(base) | fields
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SpecDeployment",
        "metadata": {"name": name},
        "spec": spec,
    }


def kubectl(cluster: Cluster, *args: str, input: str | None = None) -> str:
    """kubectl as the admin; its output, or CalledProcessError (with stderr) on failure."""
    out = subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        check=True,
        input=input,
    )
    return out.stdout


def apply_files(cluster: Cluster, *paths: Path) -> None:
    for path in paths:
        kubectl(cluster, "apply", "--server-side", "-f", str(path))


def get_or_none(read: Callable[[str, str], T], name: str, namespace: str) -> T | None:
    """read(name, namespace), or None when the object does not exist."""
    try:
        return read(name, namespace)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def create(admin: client.ApiClient, namespace: str, body: dict) -> dict:
    return client.CustomObjectsApi(admin).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )


def get_sd(admin: client.ApiClient, namespace: str, name: str) -> dict:
    return client.CustomObjectsApi(admin).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )


def patch_sd(admin: client.ApiClient, namespace: str, name: str, spec: dict) -> dict:
    return client.CustomObjectsApi(admin).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, {"spec": spec}
    )


def sd_condition(admin: client.ApiClient, namespace: str, name: str, type_: str) -> dict:
    conditions = (get_sd(admin, namespace, name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == type_), {})


def delete_specdeployments(admin: client.ApiClient, namespace: str) -> None:
    """Delete a namespace's SpecDeployments and wait until they are gone: call it while their
    operator still runs, which takes its finalizer off them (after it stops, they and their
    namespace would stay Terminating)."""
    custom = client.CustomObjectsApi(admin)
    custom.delete_collection_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    wait_until(
        "the SpecDeployments gone",
        lambda: (
            not custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        ),
        60,
    )


def start_operator(
    cluster: Cluster,
    admin: client.ApiClient,
    tmp: Path,
    rules: list[dict],
    instance: int = 100,
    log_level: str = "INFO",
    extra: Sequence[str] = (),
    lease: str | None = None,
    server: str | None = None,
    make_lease: bool = True,
) -> OperatorProcess:
    """The operator as a new ServiceAccount bound to `rules`, once the API server applies them.
    `instance` picks its liveness port: operators running at once need different ones. It
    elects itself by the Lease `lease` in OPERATOR_NS (its credentials' namespace, as a pod's
    would be); by default one of its own, so that operators of other tests on this cluster
    neither wait for it nor make it wait. `extra` names the namespaces it watches (--namespace):
    make test runs another lane's tests at once (tests/support/lanes.py), whose SpecDeployments
    an operator watching every namespace would reconcile beside their own operators.
    `server`: the API server's address in its kubeconfig, a plain-HTTP proxy in front of it
    (tests/operator/stall_proxy.py) instead of the API server itself. `make_lease=False`
    leaves the Lease for it to make, as where no chart made it. Its ServiceAccount's
    name is its log's stem."""
    assert "--namespace" in extra, "a test's operator watches only its tests' namespaces"
    name = f"spectune-operator-{uuid.uuid4().hex[:6]}"
    bind_operator(admin, OPERATOR_NS, name, rules, yaml.safe_load(LEASE_RULES.read_text()))
    kubeconfig = sa_kubeconfig(cluster, OPERATOR_NS, name, tmp / f"{name}.kubeconfig")
    if server is not None:
        config = yaml.safe_load(kubeconfig.read_text())
        config["clusters"][0]["cluster"] = {"server": server}
        kubeconfig.write_text(yaml.safe_dump(config))
    with cluster.api(kubeconfig) as as_operator:  # the new binding reaches the authorizer
        wait_until("the operator's RBAC", lambda: _can_list(as_operator))
    # released, as the chart makes it at install: a missing one is taken 15 s later
    if make_lease:
        Leases(OPERATOR_NS, lease or name, admin).create_released()
    liveness = f"http://127.0.0.1:{8000 + instance}/healthz"
    args = ["--leader-election-lease", lease or name, "--liveness", liveness,
            "--log-level", log_level, *extra]  # fmt: skip
    return launch(kubeconfig, args, tmp / f"{name}.log")


def _can_list(api: client.ApiClient) -> bool:
    client.CustomObjectsApi(api).list_cluster_custom_object(GROUP, VERSION, PLURAL)
    return True


def engine_get(pod: Any, path: str) -> Any:
    """GET a path of the real engine behind a pod, at the pod's IP, as a client in a cluster."""
    assert is_loopback(pod.status.pod_ip), pod.status.pod_ip
    with HTTP.open(f"http://{pod.status.pod_ip}:{PORT}{path}", timeout=5) as r:
        return json.load(r)


def ready_pods(admin: client.ApiClient, namespace: str, name: str) -> list[Any]:
    """The SpecDeployment's pods that are Ready and not going away."""
    pods = client.CoreV1Api(admin).list_namespaced_pod(
        namespace, label_selector=render.selector_string(name)
    )
    return [
        p
        for p in pods.items
        if p.metadata.deletion_timestamp is None
        and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    ]


def all_ready(admin: client.ApiClient, namespace: str, name: str, n: int) -> list[Any] | None:
    """The ready pods once there are exactly n of them."""
    pods = ready_pods(admin, namespace, name)
    return pods if len(pods) == n else None


def assert_engines_serve(pods: list[Any], model: str, threshold: int | None) -> None:
    """Each engine serves the model the spec names and runs the threshold the operator set."""
    for pod in pods:
        assert [m["id"] for m in engine_get(pod, "/v1/models")["data"]] == [model]
        assert engine_get(pod, "/admin/speculation")["threshold"] == threshold


@contextlib.contextmanager
def own_operator(
    cluster: Cluster,
    admin: client.ApiClient,
    tmp: Path,
    prefix: str,
    instance: int,
    extra: Sequence[str] = (),
    prometheus_url: str | None = None,
) -> Iterator[str]:
    """A namespace watched by an operator of its own (its own Lease too, see start_operator),
    reading the cluster's Prometheus (the hand-configured one unless `prometheus_url` names
    another). `instance` picks its liveness port."""
    namespace = f"{prefix}-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(admin)
    core.create_namespace({"metadata": {"name": namespace}})
    running = start_operator(
        cluster, admin, tmp, yaml.safe_load(RULES.read_text()), instance=instance,
        extra=["--namespace", namespace,
               "--prometheus-url", prometheus_url or cluster.prometheus_url, *extra],
    )  # fmt: skip
    try:
        yield namespace
    finally:
        try:
            delete_specdeployments(admin, namespace)
        finally:
            running.stop()
        print(running.log.read_text()[-3000:])
        core.delete_namespace(namespace)
