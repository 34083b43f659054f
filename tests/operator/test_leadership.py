"""The elector's threads (operator/leadership.py) on an in-memory Lease with the API server's
optimistic concurrency, at short timings: one holder at a time, hand-over on release, and a
leader that cannot renew stops acting before anyone else may take over."""

from __future__ import annotations

import copy
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from spectune.operator import leadership
from spectune.operator.lease import Record, Timing

FAST = Timing(lease_s=1, renew_s=0.1, retry_s=0.05, deadline_s=0.4, exit_s=0.7)
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class MemoryLeases:
    """Leases.read/write on one object: a write carrying a stale (or no) resourceVersion over
    an existing Lease loses, as with the API server; `down` fails every call."""

    namespace, name = "ops", "sd"

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.writes = 0
        self.down = False
        self.lock = threading.Lock()

    def read(self, timeout: float) -> dict[str, Any] | None:
        if self.down:
            raise OSError("connection refused")
        return copy.deepcopy(self.lease)

    def write(self, body: dict[str, Any], timeout: float) -> bool:
        if self.down:
            raise OSError("connection refused")
        with self.lock:
            current = None if self.lease is None else self.lease["metadata"]["resourceVersion"]
            if body["metadata"].get("resourceVersion") != current:
                return False
            self.writes += 1
            self.lease = copy.deepcopy(body)
            self.lease["metadata"]["resourceVersion"] = str(self.writes)
            return True

    def holder(self) -> str:
        assert self.lease is not None
        return Record.of(self.lease).holder


def elector(leases: MemoryLeases, identity: str, halted: list[float] | None = None):
    def halt(status: int) -> None:
        assert status == 1
        if halted is not None:
            halted.append(time.monotonic())

    return leadership.Elector(leases, identity, FAST, halt=halt)  # type: ignore[arg-type]


def stopping_after(seconds: float) -> threading.Event:
    event = threading.Event()
    threading.Timer(seconds, event.set).start()
    return event


def test_one_holder_then_hand_over_on_release() -> None:
    leases = MemoryLeases()
    first, second = elector(leases, "first"), elector(leases, "second")
    assert first.acquire(threading.Event())
    with first.holding(on_lost=pytest.fail):
        # Renewed all along, never expired: three lease durations without a take-over.
        assert not second.acquire(stopping_after(3 * FAST.lease_s))
        assert leases.holder() == "first" and leases.writes > 10
    assert leases.holder() == ""  # released
    started = time.monotonic()
    assert second.acquire(threading.Event())
    assert time.monotonic() - started < FAST.retry_s  # at the first poll
    assert leases.holder() == "second" and not first.lost.is_set()


def test_a_leader_that_cannot_renew_stops_then_exits_before_a_take_over() -> None:
    leases, halted = MemoryLeases(), []
    leader, candidate = elector(leases, "leader", halted), elector(leases, "candidate")
    assert leader.acquire(threading.Event())
    lost_at: list[float] = []
    with leader.holding(on_lost=lambda: lost_at.append(time.monotonic())):
        time.sleep(0.25)
        leases.down = True  # the API server is unreachable for the leader only...
        renewed_at = leader.renewed_at
        candidate_leases = MemoryLeases()
        candidate_leases.lease = leases.lease
        candidate.leases = candidate_leases  # ...the candidate still reaches it
        assert candidate.acquire(threading.Event())
        took_at = time.monotonic()
    assert leader.lost.is_set() and len(lost_at) == 1
    # kopf stopped at the renewal deadline, the process at exit_s, the take-over after both.
    assert renewed_at + FAST.deadline_s <= lost_at[0] < renewed_at + FAST.deadline_s + 0.15
    assert len(halted) == 1 and halted[0] < renewed_at + FAST.exit_s + 0.15
    assert took_at > halted[0] and took_at >= renewed_at + FAST.lease_s
    assert candidate_leases.holder() == "candidate"


def test_a_leader_deposed_by_another_holder_stops_at_once_and_does_not_release() -> None:
    leases, halted = MemoryLeases(), []
    leader = elector(leases, "leader", halted)
    assert leader.acquire(threading.Event())
    lost = threading.Event()
    with leader.holding(on_lost=lost.set):
        assert leases.lease is not None
        leases.lease["spec"]["holderIdentity"] = "usurper"  # e.g. after a long pause of ours
        assert lost.wait(FAST.renew_s + 0.2)
    assert leases.holder() == "usurper"  # not released: it was not ours
    time.sleep(FAST.exit_s)
    assert len(halted) == 1


def test_the_lease_namespace_is_the_credentials_one(monkeypatch, tmp_path) -> None:
    absent = tmp_path / "no-such-file"
    monkeypatch.setattr(leadership, "SERVICE_ACCOUNT_NAMESPACE", absent)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: x, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: y, user: {}}]\n"
        "contexts: [{name: c, context: {cluster: x, user: y, namespace: from-kubeconfig}}]\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    assert leadership.own_namespace() == "from-kubeconfig"
    (tmp_path / "namespace").write_text("from-service-account\n")
    monkeypatch.setattr(leadership, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "namespace")
    assert leadership.own_namespace() == "from-service-account"
    monkeypatch.setenv("POD_NAMESPACE", "from-downward-api")
    assert leadership.own_namespace() == "from-downward-api"


def test_a_standby_answers_its_liveness_endpoint_then_frees_the_port() -> None:
    url = "http://127.0.0.1:18431/healthz"
    with leadership.standby_health(url):
        assert DIRECT.open(url, timeout=2).status == 200
        with pytest.raises(urllib.error.HTTPError, match="404"):
            DIRECT.open("http://127.0.0.1:18431/other", timeout=2)
    with leadership.standby_health(url):  # kopf binds it next
        assert DIRECT.open(url, timeout=2).status == 200
    with pytest.raises(urllib.error.URLError):
        DIRECT.open(url, timeout=2)
