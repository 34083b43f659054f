"""RBAC is really on: an operator bound to the chart's rules minus one cannot act.

A module of its own, so the fully privileged operator of the other module is gone."""

from __future__ import annotations

import pytest
import yaml
from kubernetes import client

from tests.support.waiting import wait_until

from .support import RULES, create, get_or_none, specdeployment, start_operator

pytestmark = pytest.mark.cluster


def test_missing_permission_leaves_the_operator_unable_to_act(
    cluster, admin, tmp_path, namespace
) -> None:
    """Without `create deployments` the API server refuses the operator: RBAC is really on."""
    rules = [r for r in yaml.safe_load(RULES.read_text()) if r["resources"] != ["deployments"]]
    operator = start_operator(cluster, admin, tmp_path, rules, extra=["--namespace", namespace])
    try:
        create(admin, namespace, specdeployment("llm"))
        wait_until(
            "a forbidden error in the operator's log",
            lambda: "forbidden" in operator.log.read_text().lower(),
        )
        apps = client.AppsV1Api(admin)
        assert get_or_none(apps.read_namespaced_deployment, "llm", namespace) is None
    finally:
        operator.stop()
