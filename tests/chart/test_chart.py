"""The chart rendered by the real helm, without a cluster: version, lint, CRDs from the one
source, RBAC from the one rules file, the Deployment's args and security, and the schema."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from spectune.operator.crd import crd_yaml
from tests.cluster.support import REPO

from .support import CHART, INVALID, KUBE_VERSION, VALUES, find, helm, one, render, template_args

pytestmark = [pytest.mark.tools, pytest.mark.usefixtures("helm_binary")]
RULES = yaml.safe_load((CHART / "files" / "operator-rules.yaml").read_text())
LEASE_RULES = yaml.safe_load((CHART / "files" / "leader-election-rules.yaml").read_text())


def assert_lease_rights_only_in_the_release_namespace(objs: list[dict], account: str) -> None:
    """Leader election needs Lease rights in the release namespace, nowhere else: a Role there
    of exactly the rules file, bound to the operator's ServiceAccount; no ClusterRole has any."""
    name = "spectune-leader-election"
    role, binding = one(objs, "Role", name), one(objs, "RoleBinding", name)
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "default"
    assert role["rules"] == LEASE_RULES == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "verbs": ["get", "create", "update"]},
    ]  # fmt: skip
    assert binding["roleRef"]["name"] == name
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": "default"}
    ]
    cluster_rules = one(objs, "ClusterRole")["rules"]
    assert not [r for r in cluster_rules if "coordination.k8s.io" in r["apiGroups"]]


VALUE_FILES = [[], [VALUES / "ha-namespaced.yaml"], [VALUES / "monitoring.yaml"]]
# Each invalid value file and the field the schema's message must name.
INVALID_FIELDS = {
    "replicas-negative.yaml": "/replicas",
    "port-string.yaml": "/operator/metricsPort",
    "unknown-key.yaml": "'intervall' not allowed",
    "goodput-target-above-one.yaml": "/monitoring/prometheusRule/goodputTarget",
    "min-requests-zero.yaml": "/monitoring/prometheusRule/minRequests",
    "namespace-uppercase.yaml": "/operator/watchNamespaces/0",
    "prometheus-url-no-scheme.yaml": "/operator/prometheusUrl",
    "engine-image-no-repository.yaml": "/engine/image/repository",
    "prometheus-auth-secret-without-key.yaml": "/operator/prometheusAuth/bearerToken",
}


def test_chart_version_is_the_package_version() -> None:
    package = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == package


@pytest.mark.parametrize("values", VALUE_FILES, ids=["default", "ha-namespaced", "monitoring"])
def test_lint_strict(values: list[Path]) -> None:
    args = [a for v in values for a in ("-f", str(v))]
    out = helm("lint", "--strict", "--kube-version", KUBE_VERSION, str(CHART), *args)
    assert "0 chart(s) failed" in out.stdout


def test_crds_are_the_generated_ones_with_keep() -> None:
    """Templates hold crds/ as generated from the models (crds/ itself is checked against the
    models in tests/operator/test_crd.py), plus labels and the keep annotation."""
    objs = render()
    assert (REPO / "crds" / "specdeployments.spectune.io.yaml").read_text() == crd_yaml()
    for path in sorted((REPO / "crds").glob("*.yaml")):
        want = yaml.safe_load(path.read_text())
        got = one(objs, "CustomResourceDefinition", want["metadata"]["name"])
        assert got["spec"] == want["spec"], path.name
        assert got["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert got["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        assert {k: v for k, v in got.items() if k != "metadata"} == {
            k: v for k, v in want.items() if k != "metadata"
        }


def test_crds_switches() -> None:
    unkept = render(VALUES / "monitoring.yaml")
    for crd in find(unkept, "CustomResourceDefinition"):
        assert "annotations" not in crd["metadata"]
    out = helm(*_template("--set", "crds.install=false")).stdout
    assert "CustomResourceDefinition" not in out


def _template(*extra: str) -> list[str]:
    return ["template", "spectune", str(CHART), "--kube-version", KUBE_VERSION, *extra]


def test_cluster_wide_rbac_is_exactly_the_rules_file() -> None:
    objs = render()
    role = one(objs, "ClusterRole")
    assert sorted(map(json.dumps, role["rules"])) == sorted(map(json.dumps, RULES))
    assert [r["metadata"]["name"] for r in find(objs, "Role")] == ["spectune-leader-election"]
    assert_lease_rights_only_in_the_release_namespace(objs, "spectune")
    binding = one(objs, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "spectune", "namespace": "default"}
    ]


def test_watched_namespaces_get_roles_and_no_cluster_wide_rights_on_namespaced_objects() -> None:
    objs = render(VALUES / "ha-namespaced.yaml")
    cluster_rules = one(objs, "ClusterRole")["rules"]
    assert {r for rule in cluster_rules for r in rule["resources"]} == {
        "namespaces", "customresourcedefinitions",
    }  # fmt: skip
    assert_lease_rights_only_in_the_release_namespace(objs, "spectune-ha")
    roles = find(objs, "Role", "spectune")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["default", "kube-public"]
    for role in roles:  # together with the ClusterRole: exactly the rules file
        assert sorted(map(json.dumps, role["rules"] + cluster_rules)) == sorted(
            map(json.dumps, RULES)
        )
    bindings = find(objs, "RoleBinding", "spectune")
    assert {b["subjects"][0]["name"] for b in bindings} == {"spectune-ha"}
    assert one(objs, "ServiceAccount")["metadata"]["name"] == "spectune-ha"


def _container(objs: list[dict]) -> dict:
    (container,) = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def test_deployment_args_probes_and_security() -> None:
    objs = render()
    deployment = one(objs, "Deployment")
    container = _container(objs)
    assert container["image"] == "ghcr.io/spectune/spectune-operator:0.1.0"
    assert container["args"] == [
        "run",
        "--leader-election-lease=spectune",
        "--liveness=http://0.0.0.0:8080/healthz",
        "--metrics-address=0.0.0.0:9101",
        "--prometheus-url=http://prometheus-operated.monitoring.svc:9090",
        "--log-level=INFO",
        "--engine-image=ghcr.io/spectune/spectune-engine:0.1.0",
        "--pod-monitor-interval=15s",
    ]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "metrics": 9101}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["runAsNonRoot"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["serviceAccountName"] == "spectune"
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    # The Lease's namespace: the pod's own (leadership.own_namespace).
    assert {
        "name": "POD_NAMESPACE",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
    } in container["env"]


@pytest.mark.parametrize("values", VALUE_FILES, ids=["default", "ha-namespaced", "monitoring"])
def test_nothing_of_kopf_peering_is_installed(values: list[Path]) -> None:
    """Leader election by a Lease: no kopf CRD, peering object or right on one, which another
    kopf operator in the cluster may own."""
    objs = render(*values)
    crds = [c["metadata"]["name"] for c in find(objs, "CustomResourceDefinition")]
    assert crds == ["specdeployments.spectune.io"]
    assert not [o for o in objs if "kopf" in json.dumps(o)]


def test_replicas_share_one_lease_and_watch_their_namespaces() -> None:
    objs = render(VALUES / "ha-namespaced.yaml")
    assert one(objs, "Deployment")["spec"]["replicas"] == 2
    container = _container(objs)
    assert container["image"] == "registry.example.com/platform/spectune-operator:0.1.0-rc1"
    args = container["args"]
    assert [a for a in args if a.startswith("--leader-election")] == [
        "--leader-election-lease=spectune"
    ]
    # made released at install, so the first replica takes it at once (a missing Lease waits
    # a lease duration: it may have been deleted under a leader); no holder, so an upgrade
    # leaves the one who holds it
    lease = one(objs, "Lease", "spectune")
    assert lease["metadata"]["namespace"] == "default"
    assert lease["spec"] == {"leaseDurationSeconds": 15}
    assert [a for a in args if a.startswith("--namespace=")] == [
        "--namespace=default",
        "--namespace=kube-public",
    ]


def test_monitoring_objects_follow_their_values() -> None:
    plain = render()
    assert {o["kind"] for o in plain} >= {"Service", "ConfigMap"}
    assert not find(plain, "ServiceMonitor") and not find(plain, "PrometheusRule")
    assert not find(plain, "PodMonitor")
    objs = render(VALUES / "monitoring.yaml")
    monitor = one(objs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    service = one(objs, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["spec"]["selector"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    pod_monitor = one(objs, "PodMonitor")
    assert pod_monitor["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "spectune-engine"
    }
    # then the operator makes none per SpecDeployment, so that engines are scraped once
    assert "--no-engine-pod-monitors" in _container(objs)["args"]
    assert "--no-engine-pod-monitors" not in _container(plain)["args"]
    dashboard = one(objs, "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["spectune.json"]) == json.loads(
        (CHART / "files" / "dashboards" / "spectune.json").read_text()
    )


def test_the_operators_pod_monitors_get_the_labels_a_prometheus_selects_by(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kube-prometheus-stack selects PodMonitors by `release`: with the chart's own PodMonitor
    off, its `labels` and `interval` reach the operator's PodMonitors through the run flags,
    which the operator's own parser takes."""
    from spectune.operator import cli
    from spectune.operator.render import pod_monitor

    out = helm(*_template("--set", "monitoring.podMonitor.labels.release=kps",
                          "--set", "monitoring.podMonitor.interval=30s")).stdout  # fmt: skip
    args = _container([d for d in yaml.safe_load_all(out) if d])["args"]
    assert "--pod-monitor-label=release=kps" in args and "--pod-monitor-interval=30s" in args
    seen = []
    monkeypatch.setattr(cli, "_run", lambda parsed: seen.append(cli.pod_monitor_settings(parsed)))
    cli.main(["run", *(a for a in args if a.startswith("--pod-monitor-"))])
    (settings,) = seen
    assert settings is not None
    monitor = pod_monitor("llm", "ns", settings)
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["podMetricsEndpoints"][0]["interval"] == "30s"
    assert not [a for a in _container(render())["args"] if a.startswith("--pod-monitor-label")]


def test_scrape_annotations_is_off_by_default_and_reaches_the_operator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from spectune.operator import cli

    assert "--scrape-annotations" not in _container(render())["args"]
    out = helm(*_template("--set", "monitoring.scrapeAnnotations=true")).stdout
    args = _container([d for d in yaml.safe_load_all(out) if d])["args"]
    seen = []
    monkeypatch.setattr(cli, "_run", lambda parsed: seen.append(parsed.scrape_annotations))
    cli.main(["run", *(a for a in args if a == "--scrape-annotations")])
    cli.main(["run"])
    assert seen == [True, False]


def test_engine_image_defaults_to_the_app_version_and_reaches_the_operator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SpecDeployments without `spec.engine.image` run the chart's engine image: the value
    becomes the operator's --engine-image, which its own parser takes."""
    from spectune.operator import cli

    default = [a for a in _container(render())["args"] if a.startswith("--engine-image=")]
    assert default == ["--engine-image=ghcr.io/spectune/spectune-engine:0.1.0"]
    out = helm(*_template("--set", "engine.image.repository=registry.example.com/e",
                          "--set", "engine.image.tag=0.2.0-rc1")).stdout  # fmt: skip
    args = _container([d for d in yaml.safe_load_all(out) if d])["args"]
    (flag,) = [a for a in args if a.startswith("--engine-image=")]
    seen = []
    monkeypatch.setattr(cli, "_run", lambda parsed: seen.append(parsed.engine_image))
    cli.main(["run", flag])
    assert seen == ["registry.example.com/e:0.2.0-rc1"]


@pytest.mark.parametrize("name", sorted(INVALID_FIELDS))
def test_schema_rejects_invalid_values_naming_the_field(name: str) -> None:
    path = INVALID / name
    for args in (
        _template("-f", str(path)),
        ["lint", "--strict", "--kube-version", KUBE_VERSION, str(CHART), "-f", str(path)],
    ):
        out = helm(*args, check=False)
        assert out.returncode != 0, args
        assert INVALID_FIELDS[name] in out.stdout + out.stderr


def test_every_invalid_file_is_checked() -> None:
    assert sorted(p.name for p in INVALID.glob("*.yaml")) == sorted(INVALID_FIELDS)


def operator_down_alert(*values: Path, sets: tuple[str, ...] = ()) -> dict[str, Any] | None:
    args = [*template_args(*values), "--set", "monitoring.prometheusRule.enabled=true"]
    for value in sets:
        args += ["--set", value]
    objs = [d for d in yaml.safe_load_all(helm(*args).stdout) if d]
    rules = [r for g in one(objs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    return next((r for r in rules if r["alert"] == "SpectuneOperatorDown"), None)


def test_the_operator_down_alert_watches_the_job_that_scrapes_the_operator() -> None:
    """The chart's ServiceMonitor's job (its Service's name), a job named in the values, or no
    alert at all where nothing is known to scrape the operator (it would always fire)."""
    assert operator_down_alert() is None
    chart_job = operator_down_alert(VALUES / "monitoring.yaml")
    assert chart_job is not None
    assert chart_job["expr"] == 'absent(up{job="spectune-metrics"} == 1)'
    named = operator_down_alert(sets=("monitoring.prometheusRule.operatorJob=ops/spectune",))
    assert named is not None and named["expr"] == 'absent(up{job="ops/spectune"} == 1)'


def test_resources_take_quantities_as_numbers_too(tmp_path: Path) -> None:
    """A values file's `cpu: 0.5` is a YAML float, `cpu: 2` an integer: both are quantities,
    as strings are (the schema took integers and strings only)."""
    values = tmp_path / "values.yaml"
    resources = {"requests": {"cpu": 0.5, "memory": "256Mi"}, "limits": {"cpu": 2}}
    values.write_text(yaml.safe_dump({"operator": {"resources": resources}}))
    rendered = _container(render(values))["resources"]
    assert rendered["requests"] == resources["requests"]
    assert rendered["limits"]["cpu"] == 2  # beside the chart's default memory limit


def test_prometheus_credentials_come_from_secrets_mounted_as_the_flags_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 61, item 8: each credential is a Secret mounted read-only, the flag names the
    mounted file, and the operator's own parser takes the flags the chart renders."""
    from spectune.operator import cli

    auth = {
        "basicAuth": {"username": "spectune", "password": {"name": "prom", "key": "pw"}},
        "ca": {"name": "prom-ca", "key": "ca.pem"},
        "clientCertificate": "prom-client",
        "headers": {"X-Scope-OrgID": "team-a: b"},
    }
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"operator": {"prometheusAuth": auth}}))
    objs = render(values)
    container = _container(objs)
    flags = [a for a in container["args"] if a.startswith("--prometheus-") and "url" not in a]
    base = "/etc/spectune/prometheus"
    assert flags == [
        "--prometheus-basic-auth-user=spectune",
        f"--prometheus-basic-auth-password-file={base}/basic-auth/password",
        f"--prometheus-ca-file={base}/ca/ca.crt",
        f"--prometheus-cert-file={base}/client/tls.crt",
        f"--prometheus-key-file={base}/client/tls.key",
        "--prometheus-header=X-Scope-OrgID=team-a: b",
    ]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in one(objs, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    expected = {
        "prometheus-basic-auth": ("prom", [{"key": "pw", "path": "password"}]),
        "prometheus-ca": ("prom-ca", [{"key": "ca.pem", "path": "ca.crt"}]),
        "prometheus-client": (
            "prom-client",
            [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}],
        ),
    }
    for name, (secret, items) in expected.items():
        assert volumes[name]["secret"] == {"secretName": secret, "items": items}
        assert mounts[name]["readOnly"] is True
        assert mounts[name]["mountPath"] == f"{base}/{name.removeprefix('prometheus-')}"
    assert set(mounts) == {"tmp", *expected}
    seen = []
    monkeypatch.setattr(cli, "_run", lambda args: seen.append(cli.prometheus_access(args)))
    monkeypatch.setattr("pathlib.Path.is_file", lambda self: True)  # the files are in the pod
    cli.main(["run", *flags])
    assert seen[0].headers == (("X-Scope-OrgID", "team-a: b"),)
    assert seen[0].cert_file == f"{base}/client/tls.crt"

    token = tmp_path / "token.yaml"
    token.write_text(
        yaml.safe_dump({"operator": {"prometheusAuth": {"bearerToken": {"name": "t", "key": "k"}}}})
    )
    args = _container(render(token))["args"]
    assert f"--prometheus-bearer-token-file={base}/bearer-token/token" in args
    both = tmp_path / "both.yaml"
    both.write_text(
        yaml.safe_dump(
            {"operator": {"prometheusAuth": {**auth, "bearerToken": {"name": "t", "key": "k"}}}}
        )
    )
    out = helm(*template_args(both), check=False)
    assert out.returncode != 0
    assert "bearerToken and basicAuth cannot both be set" in out.stderr
