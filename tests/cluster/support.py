"""Helpers for tests against the local cluster (hack/cluster.sh): paths, clients, waiting, and
kubeconfigs for ServiceAccounts, so that code under test runs with its own RBAC, not the admin's.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from kubernetes import client, config

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / ".local"
CLUSTER_SH = REPO / "hack" / "cluster.sh"
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
ENGINE_LABEL = {"app.kubernetes.io/name": "spectune-engine"}


@dataclass(frozen=True)
class Cluster:
    """Where the running local cluster is."""

    kubeconfig: Path
    api_server: str
    prometheus_url: str  # hand-configured: annotations, 2 s scrapes
    kps_prometheus_url: str  # the Prometheus Operator's, as kube-prometheus-stack sets it up

    def api(self, kubeconfig: Path | None = None) -> client.ApiClient:
        """An API client, as the admin unless another kubeconfig is given."""
        return config.new_client_from_config(config_file=str(kubeconfig or self.kubeconfig))

    def prometheus(self, path: str, url: str | None = None, **params: str) -> Any:
        """GET a Prometheus HTTP API path (of the hand-configured one unless `url` says) and
        return its `data`."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{url or self.prometheus_url}{path}{query}", timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]


def read_cluster_env() -> Cluster:
    """The cluster that `hack/cluster.sh up` last described in .local/cluster.env."""
    env = dict(
        line.split("=", 1)
        for line in (LOCAL / "cluster.env").read_text().splitlines()
        if "=" in line
    )
    return Cluster(
        kubeconfig=Path(env["SPECTUNE_KUBECONFIG"]),
        api_server=env["SPECTUNE_API_SERVER"],
        prometheus_url=env["SPECTUNE_PROMETHEUS_URL"],
        kps_prometheus_url=env["SPECTUNE_KPS_PROMETHEUS_URL"],
    )


def cluster_sh(
    *args: str, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run hack/cluster.sh quietly, returning its output."""
    return subprocess.run(
        [str(CLUSTER_SH), *args], cwd=REPO, capture_output=True, text=True, check=check,
        timeout=timeout,
    )  # fmt: skip


def run_visible(request: pytest.FixtureRequest, cmd: list[str], label: str = "cluster") -> float:
    """Run a command with its output on the terminal even under pytest's capture, returning
    the seconds it took: a cold build prints progress for many minutes, and a silent test run
    would look hung."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print(f"\n[{label}] $ {' '.join(cmd)}", flush=True)
        t0 = time.monotonic()
        subprocess.run(cmd, cwd=REPO, check=True, stdout=sys.stdout, stderr=sys.stderr)
        seconds = time.monotonic() - t0
        print(f"[{label}] took {seconds:.1f} s", flush=True)
    return seconds


def cluster_is_up() -> bool:
    """True when every component is running and healthy (`hack/cluster.sh status`)."""
    return cluster_sh("status", check=False, timeout=60).returncode == 0


def sa_kubeconfig(
    cluster: Cluster, namespace: str, service_account: str, out: Path, seconds: int = 3600
) -> Path:
    """Write a kubeconfig that authenticates as a ServiceAccount, with a TokenRequest token.

    The Python twin of hack/sa-kubeconfig.sh. The ServiceAccount must exist.
    """
    with cluster.api() as api:
        token = (
            client.CoreV1Api(api)
            .create_namespaced_service_account_token(
                service_account,
                namespace,
                client.AuthenticationV1TokenRequest(
                    spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds)
                ),
            )
            .status.token
        )
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    user = f"system:serviceaccount:{namespace}:{service_account}"
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "spectune-local", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {
                "name": f"{namespace}-{service_account}",
                "context": {"cluster": "spectune-local", "user": user, "namespace": namespace},
            }
        ],
        "current-context": f"{namespace}-{service_account}",
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(kubeconfig))
    out.chmod(0o600)
    return out


def is_loopback(address: str) -> bool:
    """True for an IP in 127.0.0.0/8 (the only addresses anything here may talk to)."""
    try:
        return ipaddress.ip_address(address) in LOOPBACK
    except ValueError:
        return False


def our_processes() -> list[tuple[int, str]]:
    """(pid, command line) of every process the local cluster of this checkout started.

    hack/cluster.sh marks every component with SPECTUNE_CLUSTER_DIR in its environment, which
    the engines inherit from the pod runner; the binaries in .local/bin are matched by path too.
    """
    marker = f"SPECTUNE_CLUSTER_DIR={LOCAL}".encode()
    bin_dir = str(LOCAL / "bin") + "/"
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in environ or cmdline.startswith(bin_dir):
            found.append((int(proc.name), cmdline))
    return found


def require_cluster_tools(bin_dir: Path, go: str | None) -> None:
    """Fail (never skip) when the cluster's binaries are not built and there is no Go to build
    them, saying how to get them."""
    if go is None and not (bin_dir / "kube-apiserver").exists():
        pytest.fail(
            f"the local cluster's binaries are not in {bin_dir} and Go is not installed to build "
            "them: run .ci/run (it installs Go), or install Go and run `make binaries`",
            pytrace=False,
        )


def built(binary: Path, group: str) -> Path:
    """`binary`, built by hack/build-binaries.sh (its `group`) unless it is there: from the
    per-user build cache in a second, else from source. A fresh clone has none until something
    builds it, and a test that needs one may run before any cluster test."""
    if not binary.exists():
        require_cluster_tools(binary.parent, shutil.which("go"))
        build = [str(REPO / "hack" / "build-binaries.sh"), group]
        subprocess.run(build, check=True, timeout=3600)
    return binary


def load_script(name: str, folder: str = "hack") -> ModuleType:
    """<folder>/<name>.py (a script, not a package module), imported for its functions."""
    spec = importlib.util.spec_from_file_location(name, REPO / folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
