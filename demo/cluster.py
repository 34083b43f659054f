"""The demo's cluster side: set-up steps (binaries, models, the local cluster), the chart, the
operator run as the chart's ServiceAccount, and the SpecDeployment the phases reshape.

Everything runs on 127.0.0.1 (hack/cluster.sh): engine pods get loopback IPs and a real engine
behind each from the pod runner; nothing dials a Service ClusterIP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from spectune.demo.timeline import MARKED, Mark, Step
from spectune.demo.view import step_line
from spectune.operator import render
from spectune.operator.launch import OperatorProcess, launch
from spectune.operator.models import GROUP, PLURAL, VERSION

REPO = Path(__file__).resolve().parents[1]
LOCAL = REPO / ".local"
KUBECTL, HELM = LOCAL / "bin" / "kubectl", LOCAL / "bin" / "helm"
CHART = REPO / "charts" / "spectune"
EXAMPLE = REPO / "examples" / "autotune-demo.yaml"
RELEASE, SYSTEM, NAMESPACE = "spectune-demo", "spectune-demo-system", "spectune-demo"
FULLNAME = RELEASE  # the chart names its objects after a release whose name holds "spectune"
CRDS = ("specdeployments.spectune.io",)
OPERATOR_PID = LOCAL / "run" / "demo-operator.pid"
T = TypeVar("T")


class DemoError(RuntimeError):
    """A step failed; the message says which and where its log is, in one line."""


def run(cmd: list[str], what: str, **kw: Any) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if out.returncode != 0:
        last = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise DemoError(f"{what} failed: {last[0]}")
    return out.stdout


def wait(what: str, probe: Callable[[], T | None], timeout: float, every: float = 1.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := probe()) is not None:
            return value
        time.sleep(every)
    raise DemoError(f"timed out after {timeout:.0f} s waiting for {what}")


@dataclass(frozen=True)
class SetUp:
    """A set-up step: the command, and what says it is cached: a path that exists, or a
    command that succeeds."""

    name: str
    cmd: list[str]
    cached: Path | list[str]
    cold_note: str
    done: str = "built"  # what the step did when it was not cached

    def is_cached(self) -> bool:
        if isinstance(self.cached, Path):
            return self.cached.exists()
        return subprocess.run(self.cached, capture_output=True).returncode == 0


def set_up_steps(python: str) -> list[SetUp]:
    engine = str(Path(python).with_name("spectune-engine"))
    return [
        SetUp(
            "Kubernetes, kwok, helm and Prometheus binaries",
            [str(REPO / "hack" / "build-binaries.sh")],
            # built on this machine before (for another clone too): copied in seconds
            [str(REPO / "hack" / "build-binaries.sh"), "--check"],
            "compiled from their Go modules: about 30 minutes on 2 cores, once",
        ),
        SetUp(
            "the tiny target/draft model pair",
            [engine, "models", "build", "--size", "tiny"],
            REPO / ".cache" / "models",
            "trained on the standard library: about 4 minutes, once",
        ),
        SetUp(
            "the local cluster (etcd, API server, kwok GPU nodes, Prometheus, pod runner)",
            [str(REPO / "hack" / "cluster.sh"), "up"],
            LOCAL / "run" / "kube-apiserver.pid",
            "seconds",
            done="started",
        ),
    ]


def prepare(say: Callable[[str], None]) -> list[Step]:
    """Build or start what is missing, timing each step (the report lists them)."""
    steps = []
    for s in set_up_steps(sys.executable):
        cold = not s.is_cached()
        say(f"  {s.name}: {s.cold_note + ' ...' if cold else 'checking ...'}")
        began = time.monotonic()
        log = LOCAL / "logs" / "demo-setup.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as out:
            code = subprocess.run(s.cmd, stdout=out, stderr=subprocess.STDOUT).returncode
        if code != 0:
            raise DemoError(f"{s.name}: failed (exit {code}); see {log}")
        seconds = time.monotonic() - began
        steps.append(Step(name=s.name + (" (cold)" if cold else ""), seconds=round(seconds, 1)))
        say("  " + step_line(s.name, seconds, cold, note=s.cold_note, done=s.done))
    return steps


def cluster_env() -> dict[str, str]:
    lines = (LOCAL / "cluster.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


class Cluster:
    """The admin's view of the local cluster: the chart, the operator and the demo's
    SpecDeployment."""

    def __init__(self, out: Path) -> None:
        self.env = cluster_env()
        self.kubeconfig = self.env["SPECTUNE_KUBECONFIG"]
        config.load_kube_config(self.kubeconfig)
        self.core, self.custom = client.CoreV1Api(), client.CustomObjectsApi()
        self.apps = client.AppsV1Api()
        self.out = out
        self.operator: OperatorProcess | None = None
        self._products: dict[str, str] = {}

    def kubectl(self, *args: str) -> str:
        return run([str(KUBECTL), "--kubeconfig", self.kubeconfig, *args], f"kubectl {args[0]}")

    # --- the chart and the operator ----------------------------------------------------------

    def install_chart(self) -> str:
        """`helm upgrade --install` watching the demo's namespace; CRDs that tests applied
        earlier are adopted by the release first, as README tells users."""
        for ns in (SYSTEM, NAMESPACE):
            if not self._exists(self.core.read_namespace, ns):
                self.core.create_namespace({"metadata": {"name": ns}})
        existing = self.kubectl("get", "crd", "-o", "name").split()
        for crd in CRDS:
            if f"customresourcedefinition.apiextensions.k8s.io/{crd}" in existing:
                self.kubectl(
                    "label", "--overwrite", "crd", crd, "app.kubernetes.io/managed-by=Helm"
                )
                self.kubectl(
                    "annotate",
                    "--overwrite",
                    "crd",
                    crd,
                    f"meta.helm.sh/release-name={RELEASE}",
                    f"meta.helm.sh/release-namespace={SYSTEM}",
                )
        values = self.out / "values.json"
        values.write_text(
            json.dumps(
                {
                    "operator": {
                        "watchNamespaces": [NAMESPACE],
                        "prometheusUrl": self.env["SPECTUNE_PROMETHEUS_URL"],
                    }
                }
            )
        )
        return run(
            [
                str(HELM),
                "upgrade",
                "--install",
                RELEASE,
                str(CHART),
                "--namespace",
                SYSTEM,
                "-f",
                str(values),
                "--kubeconfig",
                self.kubeconfig,
            ],
            "helm install",
        )

    def start_operator(self, health_port: int, metrics_port: int) -> Path:
        """The chart's operator Deployment, run here (kwok runs no containers): its args and a
        token of its ServiceAccount, so it has exactly the chart's rights."""
        deployment = self.apps.read_namespaced_deployment(FULLNAME, SYSTEM)
        (container,) = deployment.spec.template.spec.containers
        kubeconfig = self.out / "operator.kubeconfig"
        run(
            [str(REPO / "hack" / "sa-kubeconfig.sh"), SYSTEM, FULLNAME, str(kubeconfig), "2h"],
            "a token for the operator's ServiceAccount",
            env=os.environ | {"SPECTUNE_ADMIN_KUBECONFIG": self.kubeconfig},
        )
        args = [
            *container.args,
            f"--liveness=http://127.0.0.1:{health_port}/healthz",
            f"--metrics-address=127.0.0.1:{metrics_port}",
        ]  # loopback, not the pod's 0.0.0.0
        self.operator = launch(kubeconfig, args, self.out / "operator.log", new_session=True)
        OPERATOR_PID.write_text(str(self.operator.process.pid))
        return self.operator.log

    def stop_operator(self) -> None:
        if self.operator is not None:
            self.operator.stop()
        OPERATOR_PID.unlink(missing_ok=True)

    # --- the SpecDeployment ------------------------------------------------------------------

    def fresh_deployment(self, window: int | None = None) -> dict[str, Any]:
        """The example SpecDeployment (with another calibration window when `window` says),
        created after any left by an interrupted run is gone (the operator, running, takes its
        finalizer off); returned as the API server made it (its uid tells its Events from those
        of an earlier run's)."""
        body = yaml.safe_load(EXAMPLE.read_text())
        if window is not None:
            body["spec"]["tuning"]["calibrationWindowSeconds"] = window
        name = body["metadata"]["name"]
        if self._exists(self.get, name):
            self.remove(name)
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)

    def remove(self, name: str) -> None:
        """Delete the SpecDeployment and wait until it is gone, its engines stopped."""
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
        wait(
            f"SpecDeployment {name} gone",
            lambda: None if self._exists(self.get, name) else True,
            90,
        )
        wait("its pods gone", lambda: None if self.pods(name, ready=False) else True, 90)

    def get(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)

    def patch(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, name, {"spec": spec}
        )

    def scale(self, name: str, replicas: int) -> None:
        """Through the scale subresource, as `kubectl scale sd` or an HPA does."""
        self.custom.patch_namespaced_custom_object_scale(
            GROUP, VERSION, NAMESPACE, PLURAL, name, {"spec": {"replicas": replicas}}
        )

    def pods(self, name: str, ready: bool = True) -> list[tuple[str, str, str]]:
        """(pod name, loopback URL, GPU product of its node) of the engine pods."""
        found = self.core.list_namespaced_pod(
            NAMESPACE, label_selector=render.selector_string(name)
        ).items
        rows = []
        for p in found:
            ok = any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
            if ready and (not ok or p.metadata.deletion_timestamp):
                continue
            ip = p.status.pod_ip or ""
            if ready and not ip.startswith("127."):
                raise DemoError(f"pod {p.metadata.name} has the non-loopback IP {ip}")
            rows.append((p.metadata.name, f"http://{ip}:8000", self.product(p.spec.node_name)))
        return rows

    def product(self, node: str | None) -> str:
        if not node:
            return ""
        if node not in self._products:
            labels = self.core.read_node(node).metadata.labels or {}
            self._products[node] = labels.get("nvidia.com/gpu.product", "cpu")
        return self._products[node]

    def marks(self, created: dict[str, Any], clock: Callable[[Any], float]) -> list[Mark]:
        """The operator's Events about the `created` SpecDeployment that the timeline marks, on
        the demo's clock; not those about an earlier one of the same name (Events outlive
        their object by an hour)."""
        meta = created["metadata"]
        selector = f"involvedObject.name={meta['name']},involvedObject.uid={meta['uid']}"
        events = self.core.list_namespaced_event(NAMESPACE, field_selector=selector).items
        marks = []
        for e in sorted(events, key=lambda e: e.metadata.creation_timestamp):
            if e.reason in MARKED:
                t = clock(e.metadata.creation_timestamp)
                marks.append(Mark(t=round(t, 1), phase="", reason=e.reason, message=e.message))
        return marks

    @staticmethod
    def _exists(read: Callable[[str], Any], name: str) -> bool:
        try:
            read(name)
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return True
