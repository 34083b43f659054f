"""One acting replica, elected by a Lease, and a rolling `helm upgrade` without a pause.

Replicas run as the chart runs them (each its own ServiceAccount bound to the chart's rules and
Lease rights, one Lease between them). The standby is passive over a whole window: from before
the SpecDeployment exists to after the leader reconciled it, it runs no handler and posts no
Event. A rolling update is played the way the Deployment controller plays it (a new replica
first, then SIGTERM to an old one, leader first: the worst order) with 1 and with 2 replicas;
after each SIGTERM a change to the SpecDeployment is reconciled within 30 s.
"""

from __future__ import annotations

import signal
import socket
import time
import uuid

import pytest
import yaml
from kubernetes import client

from spectune.operator.launch import OperatorProcess
from tests.support.waiting import wait_until

from .support import (
    OPERATOR_NS,
    RULES,
    create,
    get_or_none,
    patch_sd,
    specdeployment,
    start_operator,
)

pytestmark = pytest.mark.cluster
HANDLER = "'tune_continuously'"  # kopf names the daemon when it starts one
STANDBY = "waiting for the Lease"
MAX_PAUSE = 30.0  # seconds without reconciling that the issue allows during an upgrade
KOPF_HUNG_WAIT = 5.0  # seconds kopf waits at exit for a task of its own it cannot stop


def identity(operator: OperatorProcess) -> str:
    """Its holderIdentity, and its Events' reportingInstance (handlers.reporting_instance)."""
    return f"{socket.gethostname()}-{operator.process.pid}"


def holder(admin: client.ApiClient, lease: str) -> str | None:
    found = get_or_none(client.CoordinationV1Api(admin).read_namespaced_lease, lease, OPERATOR_NS)
    return None if found is None else found.spec.holder_identity


class Replicas:
    """Operator replicas sharing one Lease, watching one namespace."""

    def __init__(self, cluster, admin, tmp, namespace: str) -> None:
        self.args = (cluster, admin, tmp, yaml.safe_load(RULES.read_text()))
        self.admin, self.namespace = admin, namespace
        self.lease = f"leadership-{uuid.uuid4().hex[:6]}"
        self.started: list[OperatorProcess] = []

    def start(self) -> OperatorProcess:
        """A new replica, once it is up: leading, or standing by (Ready, as a pod would be)."""
        operator = start_operator(
            *self.args, instance=140 + len(self.started), log_level="DEBUG",
            extra=["--namespace", self.namespace], lease=self.lease,
        )  # fmt: skip
        self.started.append(operator)
        wait_until(
            "the replica to lead or stand by",
            lambda: (
                holder(self.admin, self.lease) == identity(operator)
                or STANDBY in operator.log.read_text()
            ),
        )
        return operator

    def leader(self) -> OperatorProcess:
        (leading,) = [o for o in self.started if holder(self.admin, self.lease) == identity(o)]
        return leading

    def stop_all(self) -> None:
        for operator in self.started:
            operator.stop()


def threshold_in_config(core: client.CoreV1Api, namespace: str) -> int | None:
    config = get_or_none(core.read_namespaced_config_map, "llm-engine-config", namespace)
    return (
        None
        if config is None
        else yaml.safe_load(config.data["engine.yaml"])["speculation"]["threshold"]
    )


def test_one_replica_acts_the_standby_stays_passive(cluster, admin, tmp_path, namespace) -> None:
    replicas = Replicas(cluster, admin, tmp_path, namespace)
    try:
        first = replicas.start()
        second = replicas.start()
        assert holder(admin, replicas.lease) == identity(first)
        create(admin, namespace, specdeployment("llm", replicas=0))  # no engines: replicas=0
        core = client.CoreV1Api(admin)
        wait_until("the leader to reconcile", lambda: threshold_in_config(core, namespace) == 6)
        wait_until("the leader's handlers", lambda: HANDLER in first.log.read_text())
        passive = second.log.read_text()
        assert STANDBY in passive and HANDLER not in passive, passive[-2000:]
        events = core.list_namespaced_event(namespace).items
        posters = {
            e.reporting_instance for e in events if e.involved_object.kind == "SpecDeployment"
        }
        assert posters == {identity(first)}, posters
    finally:
        replicas.stop_all()


@pytest.mark.parametrize("count", [1, 2])
def test_a_rolling_upgrade_never_pauses_reconciling_30_s(
    cluster, admin, tmp_path, namespace, count: int
) -> None:
    replicas = Replicas(cluster, admin, tmp_path, namespace)
    core = client.CoreV1Api(admin)
    try:
        old = [replicas.start() for _ in range(count)]
        create(admin, namespace, specdeployment("llm", replicas=0))
        wait_until("the first reconcile", lambda: threshold_in_config(core, namespace) == 6)
        old.sort(key=lambda o: o is not replicas.leader())  # the leader goes first
        pauses: list[float] = []
        for step, going in enumerate(old):
            replicas.start()  # maxSurge: the new pod, Ready as a standby, before an old one goes
            was_leader = going is replicas.leader()
            going.process.send_signal(signal.SIGTERM)  # the Deployment controller's
            sent = time.monotonic()
            value = 10 + step
            patch_sd(admin, namespace, "llm", {"speculation": {"threshold": {"value": value}}})
            wait_until(
                f"threshold {value} reconciled",
                lambda value=value: threshold_in_config(core, namespace) == value,
                timeout=MAX_PAUSE,
            )
            pauses.append(time.monotonic() - sent)
            assert going.process.wait(20) == 0, going.log.read_text()[-2000:]
            if was_leader:
                assert "released the Lease" in going.log.read_text()
        print(f"replicas={count}: reconciled {[f'{p:.1f}' for p in pauses]} s after each SIGTERM")
        assert max(pauses) < MAX_PAUSE
        assert holder(admin, replicas.lease) in {identity(o) for o in replicas.started[count:]}
    finally:
        replicas.stop_all()


def test_a_leader_exits_at_once_on_sigterm_and_releases_its_lease(
    cluster, admin, tmp_path, namespace
) -> None:
    """SIGTERM stops kopf through the flag kopf waits on, so the leader exits and releases its
    Lease in well under the 5 s kopf gives a task of its own it cannot stop: before, kopf took
    the signal itself, its waiter on the operator's flag hung, and every exit (a rolling
    upgrade's, a test's teardown) took those 5 s longer."""
    replicas = Replicas(cluster, admin, tmp_path, namespace)
    try:
        leader = replicas.start()
        create(admin, namespace, specdeployment("llm", replicas=0))
        wait_until("the leader's handlers", lambda: HANDLER in leader.log.read_text())
        leader.process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        assert leader.process.wait(20) == 0, leader.log.read_text()[-2000:]
        took = time.monotonic() - sent
        assert took < KOPF_HUNG_WAIT, f"exited {took:.1f} s after SIGTERM"
        assert "released the Lease" in leader.log.read_text()
        assert not holder(admin, replicas.lease)  # released: no holder
    finally:
        replicas.stop_all()
