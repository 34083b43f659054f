"""RBAC is really on: an operator bound to the chart's rules minus one cannot act.

A module of its own, so the fully privileged operator of the other module is gone."""

from __future__ import annotations

import pytest
import yaml
from kubernetes import client

from tests.cluster.support import wait_until

from .conftest import RULES, _get, create, sd, start_operator, stop

pytestmark = pytest.mark.cluster


def test_missing_permission_leaves_the_operator_unable_to_act(
    cluster, admin, tmp_path, namespace
) -> None:
    """Without `create deployments` the API server refuses the operator: RBAC is really on."""
    rules = [r for r in yaml.safe_load(RULES.read_text()) if r["resources"] != ["deployments"]]
    process, log = start_operator(cluster, admin, tmp_path, rules, priority=100)
    try:
        create(admin, namespace, sd("llm"))
        wait_until(
            "a forbidden error in the operator's log",
            lambda: "forbidden" in log.read_text().lower(),
        )
        assert _get(client.AppsV1Api(admin).read_namespaced_deployment, "llm", namespace) is None
    finally:
        stop(process)
