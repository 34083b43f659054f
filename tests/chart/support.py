"""Running the real helm on the chart: render it, lint it, install it into the local cluster."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.support import REPO

HELM = REPO / ".local" / "bin" / "helm"
CHART = REPO / "charts" / "spectune"
DASHBOARD = json.loads((CHART / "files" / "dashboards" / "spectune.json").read_text())
# What Grafana substitutes before a query reaches Prometheus.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$namespace": "default",
    "$specdeployment": ".*",
}
VALUES = Path(__file__).parent / "values"
INVALID = Path(__file__).parent / "invalid"
KUBE_VERSION = "1.37.2"  # the local cluster's; the chart requires >= 1.30


def helm(
    *args: str, check: bool = True, kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run helm; its output is returned, its failures raise with stderr in the message."""
    assert HELM.exists(), (
        f"{HELM} is not built: a test that runs helm uses the helm_binary fixture, which builds "
        "it, and is marked `tools` (or `cluster`)"
    )
    cmd = [str(HELM), *args]
    if kubeconfig is not None:
        cmd += ["--kubeconfig", str(kubeconfig)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
    return out


def template_args(*values: Path, namespace: str = "default", chart: Path = CHART) -> list[str]:
    return [
        "template", "spectune", str(chart), "--namespace", namespace,
        "--kube-version", KUBE_VERSION, *[a for v in values for a in ("-f", str(v))],
    ]  # fmt: skip


def render(*values: Path, namespace: str = "default") -> list[dict[str, Any]]:
    """The chart's objects (hooks included) for these value files."""
    out = helm(*template_args(*values, namespace=namespace)).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def find(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = find(objs, kind, name)
    return found


def dashboard_exprs(variables: dict[str, str] | None = None) -> dict[str, str]:
    """Each dashboard query (panel title and legend, or the variable's name) -> its PromQL, with
    Grafana's variables replaced by `variables` (default GRAFANA_VARIABLES)."""
    exprs = {
        f"{p['title']}: {t.get('legendFormat', '')}": t["expr"]
        for p in DASHBOARD["panels"]
        for t in p["targets"]
    }
    for variable in DASHBOARD["templating"]["list"]:
        if variable["type"] == "query":  # label_values(SELECTOR, label): Grafana's, not PromQL
            match = re.fullmatch(r"label_values\((.+), \w+\)", variable["query"]["query"])
            assert match, variable
            exprs[f"variable {variable['name']}"] = match[1]
    out = {}
    for what, expr in exprs.items():
        for name, value in (variables or GRAFANA_VARIABLES).items():
            expr = expr.replace(name, value)
        assert "$" not in expr, expr
        out[what] = expr
    return out


def umbrella_chart(directory: Path, values: dict[str, Any]) -> Path:
    """A parent chart `platform` in `directory` that depends on ours (its dependency built),
    with `values` (a `global` section, the subchart's under `spectune`)."""
    parent = directory / "platform"
    parent.mkdir()
    chart = {
        "apiVersion": "v2",
        "name": "platform",
        "version": "1.0.0",
        "dependencies": [{"name": "spectune", "version": "0.1.0", "repository": f"file://{CHART}"}],
    }
    (parent / "Chart.yaml").write_text(yaml.safe_dump(chart))
    (parent / "values.yaml").write_text(yaml.safe_dump(values))
    helm("dependency", "build", str(parent))
    return parent
