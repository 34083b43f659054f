"""The chart against the real local API server (RBAC on): its objects pass a server-side dry
run; `helm install` creates them and the operator, run as the chart's ServiceAccount with the
chart's args, reconciles the example to Ready; `helm upgrade` upgrades a changed CRD;
`helm uninstall` removes everything but the kept CRDs (none of kopf's: the operator elects
its acting replica by a Lease in the release namespace).

The cluster is shared: the release watches only a namespace of its own (so it never acts on
other tests' SpecDeployments), CRDs that exist already are adopted by the release (the README
says how), and the CRD is put back as generated after the upgrade.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from spectune.operator.launch import OperatorProcess
from tests.cluster.support import REPO, Cluster
from tests.operator.support import (
    assert_engines_serve,
    engine_get,
    get_or_none,
    get_sd,
    kubectl,
    ready_pods,
)
from tests.support.containers import user_and_root
from tests.support.ports import free_ports
from tests.support.waiting import wait_until

from .release import CRDS, Release, charts_operator, installed
from .support import CHART, VALUES, helm, template_args, umbrella_chart

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("helm_binary")]

EXAMPLE = REPO / "examples" / "specdeployment.yaml"
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, no proxy


@pytest.mark.parametrize(
    "values", [[], [VALUES / "ha-namespaced.yaml"], [VALUES / "monitoring.yaml"]],
    ids=["default", "ha-namespaced", "monitoring"],
)  # fmt: skip
def test_rendered_objects_pass_a_server_side_dry_run(cluster: Cluster, values: list[Path]) -> None:
    # The monitoring objects are checked against the Prometheus Operator's real CRDs, which
    # hack/cluster.sh installs; kubectl's strict field validation refuses an unknown field.
    manifest = helm(*template_args(*values)).stdout
    out = subprocess.run(
        [str(REPO / ".local" / "bin" / "kubectl"), "--kubeconfig", str(cluster.kubeconfig),
         "apply", "--dry-run=server", "-f", "-"],
        input=manifest, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "deployment.apps/spectune created (server dry run)" in out.stdout, out.stdout


@pytest.fixture(scope="module")
def release(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    with installed(cluster, tmp_path_factory.mktemp("chart"), {}) as release:
        yield release


def test_install_creates_crds_rbac_services_and_the_operator(cluster: Cluster, release) -> None:
    name, ns, fullname = release.name, release.namespace, release.fullname
    with cluster.api() as admin:
        ext = client.ApiextensionsV1Api(admin)
        for crd in CRDS:
            live = ext.read_custom_resource_definition(crd)
            assert live.metadata.annotations["meta.helm.sh/release-name"] == name
            assert live.metadata.annotations["helm.sh/resource-policy"] == "keep"
        rbac = client.RbacAuthorizationV1Api(admin)
        assert rbac.read_cluster_role(fullname).rules
        assert rbac.read_namespaced_role(fullname, release.watched).rules
        assert rbac.read_namespaced_role_binding(fullname, release.watched)
        core = client.CoreV1Api(admin)
        assert core.read_namespaced_service_account(fullname, ns)
        assert core.read_namespaced_service(f"{fullname}-metrics", ns)
        deployment = client.AppsV1Api(admin).read_namespaced_deployment(fullname, ns)
        assert deployment.spec.template.spec.service_account_name == fullname
    assert f"kubectl -n {ns} rollout status deployment/{fullname}" in release.install
    assert f"It manages SpecDeployments in: {release.watched}." in release.install


def test_operator_as_the_charts_service_account_reconciles_the_example(
    cluster: Cluster, release: Release
) -> None:
    """The Deployment's own args and ServiceAccount (kwok runs no containers): the operator
    takes the release's Lease with the chart's Role; the example becomes Ready (two engines
    on its H100 nodes, serving the model with its draft at its threshold), and the operator's
    metrics endpoint reports it. The one test that brings examples/specdeployment.yaml up
    outside the operator image."""
    operator = reconciles_the_example(cluster, release)
    identity = f"{socket.gethostname()}-{operator.process.pid}"
    assert f"leading: took the Lease as {identity}" in operator.log.read_text()


@pytest.mark.images
def test_the_operator_image_as_the_charts_service_account_reconciles_the_example(
    cluster: Cluster, release: Release, images: dict[str, str]
) -> None:
    """The same, with the operator in its image as the chart runs it: user 10001, a read-only
    root."""
    seen: dict[str, tuple[str, str]] = {}

    def user_and_root_of(operator: OperatorProcess) -> None:
        seen["container"] = user_and_root(release.fullname)

    reconciles_the_example(cluster, release, images["operator"], user_and_root_of)
    assert seen["container"][0] == "10001"
    assert "Read-only file system" in seen["container"][1], seen


def reconciles_the_example(
    cluster: Cluster,
    release: Release,
    image: str | None = None,
    meanwhile: Callable[[OperatorProcess], None] = lambda operator: None,
) -> OperatorProcess:
    """The release's operator (in `image` if given) brings the example to Ready; it holds the
    release's Lease under the identity it logged; `meanwhile` sees it running. Returns it,
    stopped."""
    ns, watched, fullname = release.namespace, release.watched, release.fullname
    health, metrics_port = ports = free_ports(2)
    with cluster.api() as admin, charts_operator(cluster, release, ports, image) as operator:
        log = operator.log
        try:
            kubectl(cluster, "apply", "-n", watched, "-f", str(EXAMPLE))

            def ready() -> bool:
                conditions = get_sd(admin, watched, "tiny").get("status", {}).get("conditions")
                return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

            wait_until(f"the example to be Ready (log: {log})", ready, timeout=300)
            pods = ready_pods(admin, watched, "tiny")
            assert len(pods) == 2
            assert {p.spec.node_name for p in pods} <= {"gpu-h100-0", "gpu-h100-1"}  # nodeSelector
            assert_engines_serve(pods, "tiny-target", 8)
            assert all(engine_get(p, "/admin/speculation")["method"] == "draft" for p in pods)
            with HTTP.open(f"http://127.0.0.1:{health}/healthz", timeout=5) as r:
                assert r.status == 200
            with HTTP.open(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
                text = r.read().decode()
            samples = {
                (sample.name, sample.labels.get("type", "")): sample
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.labels.get("namespace") == watched
            }
            ready_condition = samples["spectune_operator_condition", "Ready"]
            assert ready_condition.labels["status"] == "True"
            assert ready_condition.labels["specdeployment"] == "tiny"
            assert samples["spectune_operator_ready_replicas", ""].value == 2
            assert samples["spectune_operator_threshold", ""].value == 8  # the example's value
            assert "forbidden" not in log.read_text().lower()
            lease = client.CoordinationV1Api(admin).read_namespaced_lease(fullname, ns)
            took = f"leading: took the Lease as {lease.spec.holder_identity}"
            assert took in log.read_text()
            meanwhile(operator)
        finally:
            kubectl(cluster, "delete", "-n", watched, "-f", str(EXAMPLE), "--wait=false")
    return operator


def test_upgrade_updates_a_changed_crd(cluster: Cluster, release) -> None:
    chart = release.tmp / "spectune-next"
    shutil.copytree(CHART, chart, symlinks=False)  # the crds/ link becomes files to change
    path = chart / "files" / "crds" / "specdeployments.spectune.io.yaml"
    crd = yaml.safe_load(path.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["priorityClassName"] = {"type": "string", "description": "a new field"}
    path.write_text(yaml.safe_dump(crd, sort_keys=False))
    common = ["--namespace", release.namespace, "-f", str(release.values)]
    with cluster.api() as admin:
        ext = client.ApiextensionsV1Api(admin)

        def served_spec() -> dict:
            live = ext.read_custom_resource_definition(CRDS[0])
            return live.spec.versions[0].schema.open_apiv3_schema.properties["spec"].properties

        try:
            helm("upgrade", release.name, str(chart), *common, kubeconfig=cluster.kubeconfig)
            assert "priorityClassName" in served_spec()
        finally:  # the shared cluster gets the generated CRD back
            helm("upgrade", release.name, str(CHART), *common, kubeconfig=cluster.kubeconfig)
        assert "priorityClassName" not in served_spec()


def test_uninstall_removes_everything_but_the_kept_crds(cluster: Cluster, release) -> None:
    name, ns, fullname = release.name, release.namespace, release.fullname
    helm("uninstall", name, "--namespace", ns, "--wait", kubeconfig=cluster.kubeconfig)
    with cluster.api() as admin:
        rbac = client.RbacAuthorizationV1Api(admin)
        core = client.CoreV1Api(admin)
        gone = [
            (client.AppsV1Api(admin).read_namespaced_deployment, fullname, ns),
            (core.read_namespaced_service_account, fullname, ns),
            (core.read_namespaced_service, f"{fullname}-metrics", ns),
            (core.read_namespaced_config_map, f"{fullname}-dashboard", ns),
            (rbac.read_namespaced_role, fullname, release.watched),
            (rbac.read_namespaced_role_binding, fullname, release.watched),
            (rbac.read_namespaced_role, f"{fullname}-leader-election", ns),
            (rbac.read_namespaced_role_binding, f"{fullname}-leader-election", ns),
        ]
        for read, obj, namespace in gone:
            assert get_or_none(read, obj, namespace) is None, (read.__name__, obj)
        for read in (rbac.read_cluster_role, rbac.read_cluster_role_binding):
            assert get_or_none(lambda n, _ns, read=read: read(n), fullname, "") is None
        ext = client.ApiextensionsV1Api(admin)
        for crd in CRDS:
            assert ext.read_custom_resource_definition(crd).metadata.name == crd


def test_the_chart_installs_as_a_dependency_of_a_parent_that_sets_global(
    cluster: Cluster, tmp_path: Path
) -> None:
    """`helm install` of an umbrella chart whose values set `global`: the subchart's operator,
    its Lease Role and its engine image arrive; the CRDs are left to the release that has
    them (crds.install false), as a second installation in a cluster would."""
    suffix = uuid.uuid4().hex[:6]
    name, ns = f"platform-{suffix}", f"platform-{suffix}"
    parent = umbrella_chart(
        tmp_path,
        {
            "global": {"imageRegistry": "registry.example"},
            "spectune": {
                "crds": {"install": False},
                "engine": {"image": {"repository": "registry.example/spectune-engine"}},
                "operator": {"watchNamespaces": [ns]},
            },
        },
    )
    with cluster.api() as admin:
        client.CoreV1Api(admin).create_namespace({"metadata": {"name": ns}})
        try:
            helm("install", name, str(parent), "--namespace", ns, kubeconfig=cluster.kubeconfig)
            fullname = f"{name}-spectune"
            deployment = client.AppsV1Api(admin).read_namespaced_deployment(fullname, ns)
            (container,) = deployment.spec.template.spec.containers
            assert "--engine-image=registry.example/spectune-engine:0.1.0" in container.args
            rbac = client.RbacAuthorizationV1Api(admin)
            assert rbac.read_namespaced_role(f"{fullname}-leader-election", ns).rules
        finally:
            helm("uninstall", name, "--namespace", ns, "--wait", check=False,
                 kubeconfig=cluster.kubeconfig)  # fmt: skip
            client.CoreV1Api(admin).delete_namespace(ns)
