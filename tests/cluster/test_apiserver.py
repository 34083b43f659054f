"""The API server is real and enforces RBAC: a ServiceAccount gets what its Roles grant and
nothing more, which is what makes operator tests that run as their own ServiceAccount honest."""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.cluster.support import REPO, Cluster, sa_kubeconfig
from tests.support.waiting import wait_until

pytestmark = pytest.mark.cluster


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace with a ServiceAccount `nobody` that has no roles."""
    name = f"rbac-{uuid.uuid4().hex[:8]}"
    with cluster.api() as api:
        core = client.CoreV1Api(api)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        core.create_namespaced_service_account(
            name, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="nobody"))
        )
        yield name
        core.delete_namespace(name)


DEPLOYMENT = {
    "metadata": {"name": "x"},
    "spec": {
        "selector": {"matchLabels": {"app": "x"}},
        "template": {
            "metadata": {"labels": {"app": "x"}},
            "spec": {"containers": [{"name": "x", "image": "registry.invalid/x:0"}]},
        },
    },
}


def whoami(api: client.ApiClient) -> str:
    review = client.AuthenticationV1Api(api).create_self_subject_review(
        client.V1SelfSubjectReview()
    )
    return str(review.status.user_info.username)


def test_api_server_is_ready_at_the_pinned_version(cluster: Cluster) -> None:
    with cluster.api() as api:
        method, url, headers, _, _ = api.param_serialize("GET", "/readyz")
        response = api.call_api(method, url, headers)
        response.read()
        assert response.status == 200 and response.data == b"ok"
        version = client.VersionApi(api).get_code()
    go_mod = (REPO / "hack" / "tools" / "kubernetes" / "go.mod").read_text()
    pinned = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", go_mod, re.MULTILINE)
    assert pinned is not None and version.git_version == pinned[1]
    assert cluster.api_server.startswith("https://127.0.0.1:")


def test_unprivileged_service_account_is_denied(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    kubeconfig = sa_kubeconfig(cluster, namespace, "nobody", tmp_path / "nobody.kubeconfig")
    with cluster.api(kubeconfig) as api:
        assert whoami(api) == f"system:serviceaccount:{namespace}:nobody"
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        for call in (
            lambda: core.list_namespaced_pod(namespace),
            lambda: core.list_namespaced_secret("kube-system"),
            lambda: core.list_node(),
            lambda: apps.create_namespaced_deployment(namespace, DEPLOYMENT),
        ):
            with pytest.raises(ApiException) as denied:
                call()
            assert denied.value.status == 403


def test_a_role_grants_exactly_what_it_says(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    with cluster.api() as api:
        rbac = client.RbacAuthorizationV1Api(api)
        rbac.create_namespaced_role(
            namespace,
            {
                "metadata": {"name": "pod-reader"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
            },
        )
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "nobody-reads-pods"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                            "name": "pod-reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "nobody",
                              "namespace": namespace}],
            },
        )  # fmt: skip
    kubeconfig = sa_kubeconfig(cluster, namespace, "nobody", tmp_path / "nobody.kubeconfig")
    with cluster.api(kubeconfig) as api:
        core = client.CoreV1Api(api)
        wait_until("the RoleBinding to take effect", lambda: core.list_namespaced_pod(namespace))
        with pytest.raises(ApiException) as denied:
            core.list_namespaced_pod("kube-system")
        assert denied.value.status == 403


def test_shell_helper_writes_a_service_account_kubeconfig(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    out = tmp_path / "nobody.kubeconfig"
    subprocess.run(
        [str(REPO / "hack" / "sa-kubeconfig.sh"), namespace, "nobody", str(out), "10m"],
        check=True, capture_output=True,
    )  # fmt: skip
    with cluster.api(out) as api:
        assert whoami(api) == f"system:serviceaccount:{namespace}:nobody"
