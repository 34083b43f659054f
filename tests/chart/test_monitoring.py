"""Alerts and dashboard: every PromQL expression parses in the real Prometheus and names only
metrics of the engine's contract or the operator's own; the alerts load through the real
Prometheus Operator into the Prometheus it configures; the dashboard is a Grafana model."""

from __future__ import annotations

import urllib.error
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from spectune.engine import contract
from spectune.operator import metrics
from tests.cluster.support import Cluster
from tests.operator.support import kubectl
from tests.support.waiting import wait_until

from .support import DASHBOARD, VALUES, dashboard_exprs, helm, one, render, template_args

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("helm_binary")]

HISTOGRAMS = {
    contract.TIME_TO_FIRST_TOKEN, contract.INTER_TOKEN_LATENCY,
    contract.E2E_REQUEST_LATENCY, contract.STEP_SECONDS,
}  # fmt: skip
KNOWN = (
    set(contract.ALL_METRICS)
    | {f"{h}_{suffix}" for h in HISTOGRAMS for suffix in ("bucket", "sum", "count")}
    | set(metrics.ALL_METRICS)
    | {"up"}  # Prometheus's own, per target: the operator-down alert
)


def selectors(node: Any) -> Iterator[str]:
    """Metric names of every vector selector in a parsed expression (Prometheus' AST JSON)."""
    if isinstance(node, dict):
        if node.get("type") in ("vectorSelector", "matrixSelector"):
            yield node["name"]
        for child in node.values():
            yield from selectors(child)
    elif isinstance(node, list):
        for child in node:
            yield from selectors(child)


def parse(cluster: Cluster, expr: str) -> set[str]:
    """Parse with the real Prometheus; the metric names the expression reads."""
    names = set(selectors(cluster.prometheus("/api/v1/parse_query", query=expr)))
    assert names, f"no metric in {expr!r}"
    return names


def alert_rules() -> list[dict[str, Any]]:
    rule = one(render(VALUES / "monitoring.yaml"), "PrometheusRule")
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def test_alerts_parse_and_name_known_metrics(cluster: Cluster) -> None:
    rules = alert_rules()
    assert {r["alert"] for r in rules} == {
        "SpecDeploymentDegraded",
        "SpecDeploymentEnginesNotScraped",
        "SpecDeploymentCalibrationFailing",
        "SpecDeploymentGoodputBelowTarget",
        "SpecDeploymentThresholdFlapping",
        "SpectuneOperatorDown",
    }
    for rule in rules:
        assert parse(cluster, rule["expr"]) <= KNOWN, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    goodput = next(r for r in rules if r["alert"] == "SpecDeploymentGoodputBelowTarget")
    assert "< 0.95)" in goodput["expr"]  # the value file's target
    assert goodput["expr"].endswith(">= 100")  # judged from the default minimum of requests
    for name in ("SpecDeploymentDegraded", "SpecDeploymentEnginesNotScraped"):
        condition = next(r for r in rules if r["alert"] == name)
        # one alert per SpecDeployment, however many operator replicas export the condition
        assert condition["expr"].startswith("max by (namespace, specdeployment, reason)")


def test_the_prometheus_operator_loads_the_alerts_into_its_prometheus(cluster: Cluster) -> None:
    """kube-prometheus-stack's path: the PrometheusRule, labelled as its `release` selects,
    becomes a rule file of the Prometheus the operator configures, where every alert
    evaluates without error; the operator-down alert is pending there, as no operator of this
    release is scraped (the local cluster scrapes no Service)."""
    namespace = f"rules-{uuid.uuid4().hex[:8]}"
    kubectl(cluster, "create", "namespace", namespace)
    try:
        args = template_args(VALUES / "monitoring.yaml", namespace=namespace)
        out = helm(*args, "--set", "monitoring.prometheusRule.labels.release=kps").stdout
        (rule,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "PrometheusRule"]
        kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(rule))
        want = {r["alert"] for group in rule["spec"]["groups"] for r in group["rules"]}

        def evaluated() -> dict[str, dict[str, Any]] | None:
            data = cluster.prometheus("/api/v1/rules", url=cluster.kps_prometheus_url)
            rules = {
                r["name"]: r
                for group in data["groups"]
                # the operator names the file <namespace>-<name>-<uid>.yaml
                if f"/{namespace}-{rule['metadata']['name']}-" in group["file"]
                for r in group["rules"]
            }
            done = set(rules) == want and all(r["health"] != "unknown" for r in rules.values())
            return rules if done else None

        rules = wait_until("the alerts evaluated in the kps Prometheus", evaluated, timeout=120)
        assert {name: r["health"] for name, r in rules.items()} == dict.fromkeys(want, "ok")
        assert rules["SpectuneOperatorDown"]["state"] == "pending"  # for: 5m
        assert rules["SpecDeploymentDegraded"]["state"] == "inactive"
    finally:
        kubectl(cluster, "delete", "namespace", namespace, "--wait=false")


def test_dashboard_queries_parse_and_name_known_metrics(cluster: Cluster) -> None:
    used: set[str] = set()
    for expr in dashboard_exprs().values():
        names = parse(cluster, expr)
        assert names <= KNOWN, (expr, names - KNOWN)
        used |= names
    # What the dashboard promises to show.
    assert {
        contract.REQUESTS_SLO_MET, contract.SPEC_THRESHOLD, metrics.CROSSOVER,
        contract.SPEC_ACCEPTED_TOKENS, contract.STEP_OUTPUT_TOKENS,
        contract.ADMITTED_CONCURRENCY, contract.SPEC_EXPLORATION_RATIO,
    } <= used  # fmt: skip


def test_a_wrong_metric_name_is_caught(cluster: Cluster) -> None:
    """The check above is not vacuous: a typo in a metric name is not in KNOWN."""
    assert not parse(cluster, "rate(spectune_request_total[5m])") <= KNOWN
    with pytest.raises(urllib.error.HTTPError) as refused:
        parse(cluster, "rate(spectune_requests_total[5m)")
    assert refused.value.code == 400


def test_dashboard_is_a_grafana_model() -> None:
    assert isinstance(DASHBOARD["schemaVersion"], int) and DASHBOARD["schemaVersion"] >= 36
    assert DASHBOARD["uid"] and DASHBOARD["title"]
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in DASHBOARD["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}" and target["refId"]
