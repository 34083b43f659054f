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
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from spectune.operator.launch import OperatorProcess
from tests.cluster.support import LOCAL, load_script
from tests.support.waiting import wait_until

from .stall_proxy import StallProxy
from .support import (
    OPERATOR_NS,
    RULES,
    all_ready,
    create,
    get_or_none,
    get_sd,
    patch_sd,
    specdeployment,
    start_operator,
)

pytestmark = pytest.mark.cluster
audit = load_script("audit")  # hack/audit.py: the API server's audit log
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

    def start(self, server: str | None = None) -> OperatorProcess:
        """A new replica, once it is up: leading, or standing by (Ready, as a pod would be);
        `server`: a proxy it reaches the API server through."""
        operator = start_operator(
            *self.args, instance=140 + len(self.started), log_level="DEBUG",
            extra=["--namespace", self.namespace], lease=self.lease, server=server,
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


def test_an_operator_that_finds_no_lease_makes_it_and_acts(
    cluster, admin, tmp_path, namespace
) -> None:
    """The chart makes the Lease at install; an operator run without one (by hand, or after
    `kubectl delete lease`) makes it itself, a lease duration after it found it missing, and
    then acts. (The RBAC evidence, tests/operator/test_rbac_evidence.py, counts on this test
    for `create leases`.)"""
    lease = f"missing-{uuid.uuid4().hex[:6]}"
    rules = yaml.safe_load(RULES.read_text())
    extra = ["--namespace", namespace]
    operator = start_operator(
        cluster, admin, tmp_path, rules, extra=extra, lease=lease, make_lease=False
    )
    try:
        assert holder(admin, lease) is None
        taken = wait_until("the Lease made and held", lambda: holder(admin, lease), timeout=60)
        assert taken == identity(operator)
        create(admin, namespace, specdeployment("llm", replicas=0))
        wait_until("its turn's status", lambda: get_sd(admin, namespace, "llm").get("status"))
    finally:
        operator.stop()


# --- a leader cut off: the stalling proxy in front of the API server, the audit log ----------


def user_of(operator: OperatorProcess) -> str:
    """The user its API calls carry (start_operator names its ServiceAccount as its log)."""
    return audit.service_account(OPERATOR_NS, operator.log.stem)


def pushes_by(operator: OperatorProcess, pod_log: Path) -> list[datetime]:
    """When the engine logged an admin PUT from this replica (engines.USER_AGENT)."""
    mark = f"by spectune-operator ({identity(operator)})"
    return [
        datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC)
        for line in pod_log.read_text().splitlines()
        if mark in line
    ]


@pytest.fixture
def proxy(cluster) -> Iterator[StallProxy]:
    stalls = StallProxy(cluster.api_server, LOCAL / "pki" / "ca.crt")
    yield stalls
    stalls.close()


def test_a_leader_cut_off_from_its_lease_writes_nothing_once_the_standby_may_act(
    cluster, admin, tmp_path, namespace, proxy
) -> None:
    """Issue 59, A: the leader's path to its Lease hangs (every other call goes through), as
    it did when a renewal waited on discovery. It stops kopf at the renewal deadline and exits
    before its lease runs out; the standby takes over, and from that moment the old leader
    makes no write: none in the API server's audit log, no push in the engine's log."""
    replicas = Replicas(cluster, admin, tmp_path, namespace)
    core = client.CoreV1Api(admin)
    try:
        leader = replicas.start(server=proxy.url)
        standby = replicas.start()
        assert holder(admin, replicas.lease) == identity(leader)
        create(admin, namespace, specdeployment("llm", replicas=1))
        (pod,) = wait_until("the engine", lambda: all_ready(admin, namespace, "llm", 1), 120)
        pod_log = LOCAL / "logs" / "pods" / f"{namespace}_{pod.metadata.name}.log"
        patch_sd(admin, namespace, "llm", {"speculation": {"threshold": {"value": 7}}})
        wait_until("the leader's push", lambda: pushes_by(leader, pod_log), 30)
        proxy.stall(rf"/apis/coordination\.k8s\.io/v1/namespaces/[^/]+/leases/{replicas.lease}$")
        wait_until(
            "the standby to take over",
            lambda: holder(admin, replicas.lease) == identity(standby),
            40,
        )
        assert leader.process.wait(10) == 1, leader.log.read_text()[-2000:]
        patch_sd(admin, namespace, "llm", {"speculation": {"threshold": {"value": 9}}})
        wait_until("the new leader to act", lambda: threshold_in_config(core, namespace) == 9, 30)
        wait_until("its push", lambda: pushes_by(standby, pod_log), 30)
        calls = list(audit.calls())
        took = min(
            c.at for c in calls
            if c.user == user_of(standby) and c.resource == "leases" and c.verb == "update"
        )  # fmt: skip
        leader_writes = [c for c in calls if c.user == user_of(leader) and c.writes]
        assert leader_writes, "the leader wrote before it was cut off"
        late = [c for c in leader_writes if c.at >= took]
        assert late == [], late
        assert [t for t in pushes_by(leader, pod_log) if t >= took] == []
        log = leader.log.read_text()
        assert "lost the Lease (not renewed in time)" in log and "exiting" in log
        before = (took - leader_writes[-1].at).total_seconds()
        print(f"\nthe old leader's last write came {before:.1f} s before the take-over")
    finally:
        proxy.release()
        replicas.stop_all()


def test_discovery_hanging_for_the_leader_holds_up_neither_its_renewals_nor_its_turns(
    cluster, admin, tmp_path, namespace, proxy
) -> None:
    """Issue 59, A: every turn asked discovery for the PodMonitor kind, a miss re-fetched it
    under a lock the renewals also waited on: 8 s of hanging discovery let the standby take
    over while the old leader still acted. Discovery answers are kept, and renewals have a
    client of their own: the leader keeps its Lease through a minute of hanging discovery and
    still reconciles."""
    replicas = Replicas(cluster, admin, tmp_path, namespace)
    core = client.CoreV1Api(admin)
    try:
        leader = replicas.start(server=proxy.url)
        standby = replicas.start()
        create(admin, namespace, specdeployment("llm", replicas=0))
        wait_until("the first reconcile", lambda: threshold_in_config(core, namespace) == 6)
        proxy.stall(r"^/(api|apis)(/[^/]+(/[^/]+)?)?$", methods=("GET",))  # discovery only
        for value in (7, 8):
            patch_sd(admin, namespace, "llm", {"speculation": {"threshold": {"value": value}}})
            wait_until(
                f"threshold {value} reconciled",
                lambda value=value: threshold_in_config(core, namespace) == value,
                30,
            )
        time.sleep(20)  # past a lease's duration
        assert holder(admin, replicas.lease) == identity(leader)
        assert leader.process.poll() is None and "lost the Lease" not in leader.log.read_text()
        assert HANDLER not in standby.log.read_text()
    finally:
        proxy.release()
        replicas.stop_all()


def test_a_sigterm_during_a_slow_turn_releases_the_lease_only_after_it_returned(
    cluster, admin, tmp_path, namespace, proxy
) -> None:
    """Issue 59, B: kopf cancels its daemons on SIGTERM, not the threads their turns run in, and
    the Lease was released while a turn still ran. Here a turn hangs on its status write; the
    Lease stays held until the turn has returned (its write dropped), then is released."""
    replicas = Replicas(cluster, admin, tmp_path, namespace)
    leases = client.CoordinationV1Api(admin)
    try:
        leader = replicas.start(server=proxy.url)
        create(admin, namespace, specdeployment("llm", replicas=0))
        wait_until("the leader's handlers", lambda: HANDLER in leader.log.read_text())
        proxy.stall(r"/specdeployments/llm/status$", methods=("PATCH",))
        patch_sd(admin, namespace, "llm", {"replicas": 0, "slo": {"ttftMilliseconds": 900}})
        wait_until("a turn stuck in its status write", lambda: proxy.held, 30)
        leader.process.send_signal(signal.SIGTERM)
        time.sleep(3)
        assert leader.process.poll() is None  # waiting for the turn
        lease = leases.read_namespaced_lease(replicas.lease, OPERATOR_NS)
        assert lease.spec.holder_identity == identity(leader)
        proxy.release()
        assert leader.process.wait(20) == 0, leader.log.read_text()[-2000:]
        assert not holder(admin, replicas.lease)  # released, once the turn had returned
        released = [
            c.at for c in audit.calls()
            if c.user == user_of(leader) and c.resource == "leases" and c.verb == "update"
        ][-1]  # fmt: skip
        dropped = datetime.now(UTC) - timedelta(seconds=time.monotonic() - proxy.dropped[0])
        assert released >= dropped - timedelta(seconds=0.05)
    finally:
        proxy.release()
        replicas.stop_all()
