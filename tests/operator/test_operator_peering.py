"""One active operator: a lower-priority replica stays passive until the active one goes.

Passive means over a whole window, not at one moment: from before the SpecDeployment exists,
through the active replica's turn on a change, to two turns after it, the passive
replica neither runs a handler (its DEBUG log names every handler run) nor posts an Event
(each Event names the replica that posted it). A module of its own, so no other operator runs.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from spectune.operator.launch import OperatorProcess
from spectune.operator.models import GROUP, PLURAL, VERSION
from tests.support.waiting import wait_until

from .support import RULES, create, get_or_none, get_sd, specdeployment, start_operator

pytestmark = pytest.mark.cluster
RESUMED = "Resuming operations"
HANDLER = "'tune_continuously'"  # kopf names the daemon when it starts one
TICK = ": turn committed"  # the daemon's DEBUG line for each turn


def instance(operator: OperatorProcess) -> str:
    """The reportingInstance of the Events a replica posts (see handlers.reporting_instance)."""
    return f"{socket.gethostname()}-{operator.process.pid}"


def text(log: Path) -> str:
    return log.read_text()


def has_peer(admin: client.ApiClient, priority: int) -> bool:
    """Whether a replica of that priority has announced itself in the ClusterKopfPeering."""
    peering = client.CustomObjectsApi(admin).get_cluster_custom_object(
        "kopf.dev", "v1", "clusterkopfpeerings", "spectune"
    )
    return any(peer.get("priority") == priority for peer in (peering.get("status") or {}).values())


def test_second_operator_stays_passive_until_the_first_goes(
    cluster, admin, tmp_path, namespace
) -> None:
    rules = yaml.safe_load(RULES.read_text())
    first = start_operator(cluster, admin, tmp_path, rules, 100, "DEBUG")
    first_log = first.log
    wait_until("the first operator to be active", lambda: RESUMED in text(first_log))
    second = start_operator(cluster, admin, tmp_path, rules, 10, "DEBUG")
    second_log = second.log
    try:
        # It starts paused (peering is mandatory) and stays so once it sees the first.
        wait_until("the second operator to join the peering", lambda: has_peer(admin, 10))
        # no engines: the operators are tested
        create(admin, namespace, specdeployment("llm", replicas=0))
        apps, core = client.AppsV1Api(admin), client.CoreV1Api(admin)
        wait_until(
            "the Deployment", lambda: get_or_none(apps.read_namespaced_deployment, "llm", namespace)
        )

        # A change, reconciled by the first replica from start to end, then two resync ticks.
        threshold = {"spec": {"speculation": {"threshold": {"value": 7}}}}
        changed = client.CustomObjectsApi(admin).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "llm", threshold
        )
        ticks = text(first_log).count(TICK)

        def reconciled() -> bool:
            config = core.read_namespaced_config_map("llm-engine-config", namespace)
            status = get_sd(admin, namespace, "llm").get("status", {})
            return (
                yaml.safe_load(config.data["engine.yaml"])["speculation"]["threshold"] == 7
                and status.get("observedGeneration") == changed["metadata"]["generation"]
            )

        wait_until("the first operator to reconcile the change", reconciled)
        wait_until("two resync ticks after it", lambda: text(first_log).count(TICK) >= ticks + 2)

        passive = text(second_log)
        assert HANDLER not in passive and TICK not in passive, passive[-2000:]
        assert RESUMED not in passive, passive[-2000:]
        events = core.list_namespaced_event(namespace).items
        posters = {
            e.reporting_instance for e in events if e.involved_object.kind == "SpecDeployment"
        }
        assert posters == {instance(first)}, posters

        first.stop()
        wait_until("the second operator to take over", lambda: RESUMED in text(second_log))
        wait_until("the second operator's handlers", lambda: TICK in text(second_log))
    finally:
        first.stop()
        second.stop()
