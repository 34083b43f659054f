"""The operator as a child process, with credentials of its own: how the tests, the chart tests,
the demo and the benchmarks run it beside the local cluster (kwok runs no containers, so the
chart's Deployment never starts it). One place, so that every caller stops it the same way:
SIGINT lets kopf remove its finalizers' work and the operator release its Lease cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class OperatorProcess:
    """A running `spectune-operator run` and the file its output goes to."""

    process: subprocess.Popen
    log: Path

    def stop(self, timeout: float = 20) -> None:
        """SIGINT (kopf's clean exit), then SIGKILL if it has not exited within `timeout`."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL: a crash, as far as the cluster can tell."""
        self.process.kill()
        self.process.wait(10)


def launch(
    kubeconfig: Path | str,
    args: Sequence[str],
    log: Path,
    env: Mapping[str, str] | None = None,
    new_session: bool = False,
) -> OperatorProcess:
    """Start `spectune-operator run ARGS` (args[0] may already be "run") with this kubeconfig,
    its output in `log`. `env` replaces the caller's environment (default: inherited);
    `new_session` keeps a terminal's Ctrl-C from reaching it, so the caller stops it in order."""
    argv = list(args) if args[:1] == ["run"] else ["run", *args]
    process = subprocess.Popen(
        [sys.executable, "-m", "spectune.operator.cli", *argv],
        env={**(os.environ if env is None else env), "KUBECONFIG": str(kubeconfig)},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=new_session,
    )
    return OperatorProcess(process, log)


def bind_operator(
    api: Any, namespace: str, name: str, rules: list[dict], lease_rules: list[dict]
) -> None:
    """A ServiceAccount `name` in `namespace` bound to a ClusterRole of `rules`, and, as the
    chart binds it, to a Role of `lease_rules` (leader election) in that namespace: the
    operator then runs with exactly the chart's rights, and the API server's audit log names
    its calls. `api`: an admin's kubernetes ApiClient."""
    from kubernetes import client

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
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    }
    client.CoreV1Api(api).create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    rbac.create_cluster_role(role)
    rbac.create_cluster_role_binding(binding)
    lease_role = role | {"kind": "Role", "rules": lease_rules}
    lease_binding = binding | {
        "kind": "RoleBinding",
        "roleRef": binding["roleRef"] | {"kind": "Role"},
    }
    rbac.create_namespaced_role(namespace, lease_role)
    rbac.create_namespaced_role_binding(namespace, lease_binding)
