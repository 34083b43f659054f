"""A `helm install` of the chart on the local cluster, and its operator run as the chart's
Deployment would run it (kwok runs no containers): the Deployment's own args, as the chart's
ServiceAccount, on loopback ports."""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from spectune.operator.launch import OperatorProcess, launch
from tests.cluster.support import Cluster, sa_kubeconfig
from tests.operator.support import kubectl
from tests.support.containers import podman_env, run_command

from .support import CHART, helm

CRDS = ["specdeployments.spectune.io"]


@dataclass(frozen=True)
class Release:
    """A release in a namespace of its own that watches another namespace of its own."""

    name: str
    namespace: str
    watched: str
    tmp: Path
    values: Path
    install: str  # what `helm install` printed (NOTES.txt)

    @property
    def fullname(self) -> str:
        return f"{self.name}-spectune"


def adopt_existing_crds(cluster: Cluster, release: str, namespace: str) -> None:
    """CRDs applied earlier (by kubectl) become the release's, as README tells users."""
    existing = kubectl(cluster, "get", "crd", "-o", "name").split()
    for name in CRDS:
        if f"customresourcedefinition.apiextensions.k8s.io/{name}" in existing:
            kubectl(
                cluster, "label", "--overwrite", "crd", name, "app.kubernetes.io/managed-by=Helm"
            )
            kubectl(
                cluster, "annotate", "--overwrite", "crd", name,
                f"meta.helm.sh/release-name={release}",
                f"meta.helm.sh/release-namespace={namespace}",
            )  # fmt: skip


@contextlib.contextmanager
def installed(
    cluster: Cluster, tmp: Path, values: dict[str, Any], prefix: str = "st"
) -> Iterator[Release]:
    """`helm install` with `values` (the watched namespace and the cluster's Prometheus unless
    they say otherwise); uninstalled, and both namespaces deleted, afterwards."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    namespace, watched = f"{name}-system", f"{name}-apps"
    operator = {"watchNamespaces": [watched], "prometheusUrl": cluster.prometheus_url}
    merged = {**values, "operator": {**operator, **values.get("operator", {})}}
    (tmp / "values.json").write_text(json.dumps(merged))
    with cluster.api() as admin:
        core = client.CoreV1Api(admin)
        for ns in (namespace, watched):
            core.create_namespace({"metadata": {"name": ns}})
        adopt_existing_crds(cluster, name, namespace)
        out = helm(
            "install", name, str(CHART), "--namespace", namespace,
            "-f", str(tmp / "values.json"), kubeconfig=cluster.kubeconfig,
        ).stdout  # fmt: skip
        try:
            yield Release(name, namespace, watched, tmp, tmp / "values.json", out)
        finally:
            helm(
                "uninstall", name, "--namespace", namespace, "--wait",
                check=False, kubeconfig=cluster.kubeconfig,
            )  # fmt: skip
            for ns in (watched, namespace):
                core.delete_namespace(ns)


@contextlib.contextmanager
def charts_operator(
    cluster: Cluster, release: Release, ports: tuple[int, int], image: str | None = None
) -> Iterator[OperatorProcess]:
    """The release's operator: its Deployment's container args as its ServiceAccount, liveness
    and metrics on the loopback `ports` instead of the pod's 0.0.0.0 (later flags win). With
    `image`, in the operator image as the chart runs it (podman: the image's user, a read-only
    root, /tmp its one writable volume), its container named `release.fullname`."""
    with cluster.api() as admin:
        deployment = client.AppsV1Api(admin).read_namespaced_deployment(
            release.fullname, release.namespace
        )
    (container,) = deployment.spec.template.spec.containers
    kubeconfig = sa_kubeconfig(
        cluster, release.namespace, release.fullname, release.tmp / "operator.kubeconfig"
    )
    health, metrics_port = ports
    args = [
        *container.args,
        f"--liveness=http://127.0.0.1:{health}/healthz",
        f"--metrics-address=127.0.0.1:{metrics_port}",
    ]
    log = release.tmp / "operator.log"
    if image is None:
        operator = launch(kubeconfig, args, log, env={"PATH": "/usr/bin:/bin"})
    else:
        kubeconfig.chmod(0o644)  # the image's user reads it, as a pod reads its token
        mounted = "/var/run/spectune/kubeconfig"
        command = run_command(
            image,
            args,
            name=release.fullname,
            read_only={kubeconfig: mounted},
            env={"KUBECONFIG": mounted},
        )
        process = subprocess.Popen(
            command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=podman_env()
        )
        operator = OperatorProcess(process, log)
    try:
        yield operator
    finally:
        operator.stop()
