"""One active operator: a lower-priority replica stays passive until the active one goes.

A module of its own, so no other operator is running."""

from __future__ import annotations

import pytest
import yaml
from kubernetes import client

from tests.cluster.support import wait_until

from .conftest import RULES, _get, create, sd, start_operator, stop

pytestmark = pytest.mark.cluster
HANDLED = "Handler '"  # kopf logs "Handler 'name' succeeded." for each handler run
RESUMED = "Resuming operations"


def test_second_operator_stays_passive_until_the_first_goes(
    cluster, admin, tmp_path, namespace
) -> None:
    rules = yaml.safe_load(RULES.read_text())
    first, first_log = start_operator(cluster, admin, tmp_path, rules, priority=100)
    wait_until("the first operator to be active", lambda: RESUMED in first_log.read_text())
    second, second_log = start_operator(cluster, admin, tmp_path, rules, priority=10)
    try:
        create(admin, namespace, sd("llm"))
        apps = client.AppsV1Api(admin)
        wait_until(
            "the Deployment", lambda: _get(apps.read_namespaced_deployment, "llm", namespace)
        )
        wait_until("the first operator's handlers", lambda: HANDLED in first_log.read_text())
        assert RESUMED not in second_log.read_text() and HANDLED not in second_log.read_text()

        stop(first)
        wait_until("the second operator to take over", lambda: RESUMED in second_log.read_text())
        wait_until("the second operator's handlers", lambda: HANDLED in second_log.read_text())
    finally:
        stop(first)
        stop(second)
