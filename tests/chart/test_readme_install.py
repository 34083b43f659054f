"""README's "Install on your cluster", executed as far as the local cluster allows (issue 61):
the chart with exactly the values its `helm install` documents, rendered by the real helm and
applied as a server-side dry run (the API server's schemas, the Prometheus Operator's CRDs
and admission answer for every object), and every object of every example and of the
install's shell blocks the same way. What the local cluster cannot do is said: it runs no
operator image from a registry (test_chart_cluster.py runs the chart's operator), and the
weights Job's `hf download` is checked in the image by tests/chart/test_images.py."""

from __future__ import annotations

import re
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tests.cluster.support import LOCAL, REPO, Cluster

from .support import KUBE_VERSION, helm

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("helm_binary")]
README = REPO / "README.md"
REGISTRY = "registry.example.com/platform"  # README's placeholder, REGISTRY


def shell_blocks(heading: str) -> list[str]:
    """The ```sh blocks of README's section `heading` (up to the next heading)."""
    text = README.read_text()
    start = text.index(f"\n{heading}\n")
    end = re.compile(r"\n#{2,3} ").search(text, start + len(heading) + 2)
    section = text[start : end.start() if end else len(text)]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def commands(block: str) -> list[list[str]]:
    """Each command of a shell block as words (continuations joined, comments dropped)."""
    joined = block.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()]


def kubectl(cluster: Cluster, *args: str, input: str | None = None) -> str:
    out = subprocess.run(
        [str(LOCAL / "bin" / "kubectl"), "--kubeconfig", str(cluster.kubeconfig), *args],
        input=input, capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert out.returncode == 0, f"kubectl {' '.join(args)}:\n{out.stderr}"
    return out.stdout


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    name = f"readme-{uuid.uuid4().hex[:8]}"
    with cluster.api() as api:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
        yield name
        client.CoreV1Api(api).delete_namespace(name)


def test_the_documented_helm_install_renders_objects_the_api_server_admits(
    cluster: Cluster, namespace: str
) -> None:
    (install, *after) = commands(shell_blocks("### Install the chart")[0])
    assert install[:4] == ["helm", "install", "spectune", "charts/spectune"], install
    assert [c[:3] for c in after] == [["kubectl", "-n", "spectune-system"]], after  # rollout
    args = [a.replace("REGISTRY", REGISTRY) for a in install[4:]]
    assert "--create-namespace" in args and args[args.index("-n") + 1] == "spectune-system"
    # the same values, as `helm template`, into a namespace of this test's (the cluster is
    # shared: the tests' own operators live in spectune-system)
    args.remove("--create-namespace")
    args[args.index("-n") + 1] = namespace
    chart = str(REPO / "charts" / "spectune")
    manifest = helm("template", "spectune", chart, "--kube-version", KUBE_VERSION, *args).stdout
    objs = [o for o in yaml.safe_load_all(manifest) if o]
    applied = kubectl(cluster, "apply", "--dry-run=server", "-f", "-", input=manifest)
    for obj in objs:
        kind = obj["kind"].lower()
        assert f"{kind}" in applied and obj["metadata"]["name"] in applied, (kind, applied)
    kinds = {o["kind"] for o in objs}
    assert {"Deployment", "ServiceMonitor", "PrometheusRule"} <= kinds, kinds
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith(f"{REGISTRY}/spectune-operator:")
    assert "--prometheus-url=http://prometheus-operated.monitoring.svc:9090" in container["args"]
    # the engines' PodMonitors are the operator's, one per SpecDeployment: labelled so
    assert {"--pod-monitor-label=release=kps", "--pod-monitor-interval=30s"} <= set(
        container["args"]
    )
    for kind in ("ServiceMonitor", "PrometheusRule"):
        (obj,) = [o for o in objs if o["kind"] == kind]
        assert obj["metadata"]["labels"]["release"] == "kps", kind


def test_every_example_and_documented_object_is_admitted(cluster: Cluster, namespace: str) -> None:
    """Every example file, and the Secret README's weights section creates, pass a server-side
    dry run (the SpecDeployment CRD with its CEL rules is the cluster's: the tests apply it)."""
    weights = commands(shell_blocks("### Put the weights on a claim")[0])
    secret = next(c for c in weights if c[:3] == ["kubectl", "create", "secret"])
    out = kubectl(cluster, *secret[1:], "-n", namespace, "--dry-run=server", "-o", "name")
    assert out.strip() == "secret/hf-token"
    crd = REPO / "crds" / "specdeployments.spectune.io.yaml"
    kubectl(cluster, "apply", "--server-side", "-f", str(crd))
    kubectl(cluster, "wait", "--for=condition=established", "-f", str(crd))
    files = sorted((REPO / "examples").glob("*.yaml"))
    assert len(files) >= 4, files
    applied_files = {c[-1] for b in ("### Put the weights on a claim", "### Serve a model")
                     for block in shell_blocks(b) for c in commands(block)
                     if c[:3] == ["kubectl", "apply", "-f"]}  # fmt: skip
    assert applied_files <= {str(f.relative_to(REPO)) for f in files}, applied_files
    for path in files:
        out = kubectl(cluster, "apply", "--dry-run=server", "-n", namespace, "-f", str(path))
        count = sum(1 for o in yaml.safe_load_all(Path(path).read_text()) if o)
        assert out.count("(server dry run)") == count, (path.name, out)


def test_the_documented_prometheus_credentials_render_and_are_admitted(
    cluster: Cluster, namespace: str
) -> None:
    """README's `helm upgrade` for a Prometheus behind basic auth and a tenant header."""
    (secret, upgrade) = commands(shell_blocks("### Install the chart")[1])
    assert secret[:4] == ["kubectl", "-n", "spectune-system", "create"], secret
    assert upgrade[:4] == ["helm", "upgrade", "spectune", "charts/spectune"], upgrade
    sets = [a for a in upgrade[4:] if a not in ("--reuse-values", "-n", "spectune-system")]
    chart = str(REPO / "charts" / "spectune")
    manifest = helm("template", "spectune", chart, "--kube-version", KUBE_VERSION,
                    "-n", namespace, *sets).stdout  # fmt: skip
    kubectl(cluster, "apply", "--dry-run=server", "-f", "-", input=manifest)
    (deployment,) = [o for o in yaml.safe_load_all(manifest) if o and o["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {
        "--prometheus-url=https://mimir.example.com/prometheus",
        "--prometheus-basic-auth-user=spectune",
        "--prometheus-basic-auth-password-file=/etc/spectune/prometheus/basic-auth/password",
        "--prometheus-header=X-Scope-OrgID=team-a",
    } <= set(args), args
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == secret[secret.index("generic") + 1] == "mimir"
