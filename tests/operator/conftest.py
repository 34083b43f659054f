"""Fixtures and helpers for the operator against the real local API server (RBAC on): the
operator runs as its own ServiceAccount bound to exactly the chart's ClusterRole rules."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster.support import REPO, Cluster, sa_kubeconfig, wait_until

RULES = REPO / "charts" / "spectune" / "files" / "operator-rules.yaml"
KUBECTL = REPO / ".local" / "bin" / "kubectl"
OPERATOR_NS = "spectune-system"
GROUP, VERSION, PLURAL = "spectune.io", "v1alpha1", "specdeployments"
T = TypeVar("T")


def sd(name: str, **spec: object) -> dict:
    body = {
        "replicas": 2,
        "model": {"name": "tiny-target"},
        "engine": {"gpus": 1, "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
        "speculation": {"method": "ngram", "threshold": {"mode": "Manual", "value": 6}},
    }
    body.update(spec)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SpecDeployment",
        "metadata": {"name": name},
        "spec": body,
    }


def apply_files(cluster: Cluster, *paths: Path) -> None:
    for path in paths:
        kubectl(cluster, "apply", "--server-side", "-f", str(path))


def bind_operator(api: client.ApiClient, name: str, rules: list[dict]) -> None:
    rbac = client.RbacAuthorizationV1Api(api)
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": rules,
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": OPERATOR_NS}],
    }
    client.CoreV1Api(api).create_namespaced_service_account(
        OPERATOR_NS, {"metadata": {"name": name}}
    )
    rbac.create_cluster_role(role)
    rbac.create_cluster_role_binding(binding)


@pytest.fixture(scope="module")
def admin(cluster: Cluster) -> Iterator[client.ApiClient]:
    api = cluster.api()
    apply_files(
        cluster,
        REPO / "crds" / "specdeployments.spectune.io.yaml",
        REPO / "crds" / "kopf-peering.yaml",
    )
    wait_until("the CRDs to be served", lambda: _served(api))
    try:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": OPERATOR_NS}})
    except ApiException as err:
        assert err.status == 409
    yield api
    api.close()


def _served(api: client.ApiClient) -> bool:
    client.CustomObjectsApi(api).list_cluster_custom_object(GROUP, VERSION, PLURAL)
    client.CustomObjectsApi(api).list_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings")
    return True


def start_operator(
    cluster: Cluster,
    admin: client.ApiClient,
    tmp: Path,
    rules: list[dict],
    priority: int = 100,
    log_level: str = "INFO",
    extra: Sequence[str] = (),
) -> tuple[subprocess.Popen, Path]:
    name = f"spectune-operator-{uuid.uuid4().hex[:6]}"
    bind_operator(admin, name, rules)
    kubeconfig = sa_kubeconfig(cluster, OPERATOR_NS, name, tmp / f"{name}.kubeconfig")
    with cluster.api(kubeconfig) as as_operator:  # the new binding reaches the authorizer
        wait_until("the operator's RBAC", lambda: _can_list(as_operator))
    log = tmp / f"{name}.log"
    env = os.environ | {"KUBECONFIG": str(kubeconfig)}
    cmd = [
        sys.executable,
        "-m",
        "spectune.operator.cli",
        "run",
        "--priority",
        str(priority),
        "--liveness",
        f"http://127.0.0.1:{8000 + priority}/healthz",
        "--log-level",
        log_level,
        *extra,
    ]
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT), log


def _can_list(api: client.ApiClient) -> bool:
    client.CustomObjectsApi(api).list_cluster_custom_object(GROUP, VERSION, PLURAL)
    return True


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.fixture(scope="module")
def operator(cluster: Cluster, admin: client.ApiClient, tmp_path_factory) -> Iterator[Path]:
    process, log = start_operator(
        cluster, admin, tmp_path_factory.mktemp("operator"), yaml.safe_load(RULES.read_text())
    )
    yield log
    stop(process)


@pytest.fixture
def namespace(admin: client.ApiClient) -> Iterator[str]:
    name = f"sd-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(admin).create_namespace({"metadata": {"name": name}})
    yield name
    client.CoreV1Api(admin).delete_namespace(name)


def create(admin: client.ApiClient, namespace: str, body: dict) -> dict:
    return client.CustomObjectsApi(admin).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )


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


def get_sd(admin: client.ApiClient, namespace: str, name: str) -> dict:
    return client.CustomObjectsApi(admin).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )


def kubectl(cluster: Cluster, *args: str) -> str:
    out = subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout


def _get(read: Callable[[str, str], T], name: str, namespace: str) -> T | None:
    try:
        return read(name, namespace)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


@pytest.fixture(scope="module")
def tuner(cluster: Cluster, admin: client.ApiClient, tmp_path_factory) -> Iterator[str]:
    """A namespace watched by an operator of its own (its own peering, so that operators of
    other test runs on this cluster neither pause it nor are paused by it; the operator makes
    the peering, as its RBAC allows)."""
    namespace = f"autotune-{uuid.uuid4().hex[:8]}"
    peering = f"autotune-{uuid.uuid4().hex[:6]}"
    core, custom = client.CoreV1Api(admin), client.CustomObjectsApi(admin)
    core.create_namespace({"metadata": {"name": namespace}})
    process, log = start_operator(
        cluster, admin, tmp_path_factory.mktemp("autotune"), yaml.safe_load(RULES.read_text()),
        priority=170, extra=["--namespace", namespace, "--peering", peering,
                             "--prometheus-url", cluster.prometheus_url],
    )  # fmt: skip
    yield namespace
    try:
        delete_specdeployments(admin, namespace)
    finally:
        stop(process)
    print(Path(log).read_text()[-3000:])
    core.delete_namespace(namespace)
    custom.delete_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", peering)
