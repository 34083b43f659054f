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


class StuckLeases(MemoryLeases):
    """MemoryLeases whose calls hang, once `stuck` is set, until released: a renewal stuck in a
    call that never returns (a discovery re-fetch without a timeout, a lock a turn holds)."""

    def __init__(self) -> None:
        super().__init__()
        self.stuck = threading.Event()
        self.unstuck = threading.Event()

    def read(self, timeout: float) -> dict[str, Any] | None:
        if self.stuck.is_set():
            self.unstuck.wait()
        return super().read(timeout)


def test_a_renewal_stuck_in_a_call_stops_kopf_and_exits_on_the_clock() -> None:
    """Issue 59, A: the deadline was checked only between the renewer's calls, so a call
    stuck for 8 s held it 8 s past the deadline, kopf still running, no exit armed. The
    watchdog waits on nothing but the clock."""
    leases, halted = StuckLeases(), []
    leader = elector(leases, "leader", halted)
    assert leader.acquire(threading.Event())
    lost_at: list[float] = []
    threading.Timer(FAST.exit_s + 1.5, leases.unstuck.set).start()  # long after the exit
    try:
        with leader.holding(on_lost=lambda: lost_at.append(time.monotonic())):
            time.sleep(0.2)
            leases.stuck.set()
            renewed_at = leader.renewed_at
            time.sleep(FAST.exit_s + 0.3)
            assert len(lost_at) == 1 and len(halted) == 1
            assert renewed_at + FAST.deadline_s <= lost_at[0] < renewed_at + FAST.deadline_s + 0.1
            assert renewed_at + FAST.exit_s <= halted[0] < renewed_at + FAST.exit_s + 0.1
    finally:
        leases.unstuck.set()
    assert leases.holder() == "leader"  # not released: lost


def test_the_lease_client_never_waits_on_the_operators_discovery(monkeypatch) -> None:
    """Issue 59, A: renewals went through the operator's dynamic client, whose lookups share
    one lock with every turn's; a turn stuck holding it (here: held for the whole test) held the
    renewals too. The Lease client is its own, and every call carries its timeout."""
    from kubernetes import client

    from spectune.operator import kube

    served = LeaseServer()
    api = client.ApiClient(client.Configuration(host=served.url))
    leases = leadership.Leases("ops", "sd", api)
    with kube._DYNAMIC:  # a turn's thread stuck in discovery
        started = time.monotonic()
        assert leases.read(1.0) is None
        assert leases.write(lease_body("me"), 1.0)
        assert Record.of(leases.read(1.0) or {}).holder == "me"
        assert time.monotonic() - started < 1.0
        served.stall = 5.0
        started = time.monotonic()
        with pytest.raises(leadership.TRANSIENT):
            leases.read(0.3)
        assert time.monotonic() - started < 1.5  # the timeout, not the stall
    served.close()


def lease_body(holder: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "sd", "namespace": "ops"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
    }


class LeaseServer:
    """The API server's Lease endpoints for one Lease on a loopback port: GET, POST and PUT,
    with optimistic concurrency; `stall` seconds before answering."""

    def __init__(self) -> None:
        import http.server
        import json

        state = self
        self.lease: dict[str, Any] | None = None
        self.stall = 0.0

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, code: int, body: dict[str, Any]) -> None:
                time.sleep(state.stall)
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if state.lease is None:
                    return self._answer(404, {"kind": "Status", "code": 404})
                self._answer(200, state.lease)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if state.lease is not None:
                    return self._answer(409, {"kind": "Status", "code": 409})
                body["metadata"]["resourceVersion"] = "1"
                state.lease = body
                self._answer(201, body)

            do_PUT = do_POST

            def log_message(self, *_: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_discovery_answers_are_kept_for_the_process(monkeypatch) -> None:
    """Issue 59, A: every turn asked discovery for the PodMonitor kind; where the cluster does
    not serve it, the client threw its whole cache away and fetched it anew each time. Found
    kinds are kept; a missing one is asked again only after MISSING_TTL_SECONDS."""
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    from spectune.operator import kube

    asked: list[str] = []

    class Resources:
        def get(self, api_version: str, kind: str) -> str:
            asked.append(kind)
            if kind == "PodMonitor":
                raise ResourceNotFoundError(kind)
            return f"resource {kind}"

    class Dynamic:
        resources = Resources()

    monkeypatch.setattr(kube, "_make_dynamic", lambda: Dynamic())
    monkeypatch.setattr(kube, "_FOUND", {})
    monkeypatch.setattr(kube, "_MISSING", {})
    clock = [100.0]
    for _ in range(3):
        assert kube.resource("v1", "Pod", lambda: clock[0]) == "resource Pod"
        with pytest.raises(ResourceNotFoundError):
            kube.resource("monitoring.coreos.com/v1", "PodMonitor", lambda: clock[0])
    assert asked == ["Pod", "PodMonitor"]
    clock[0] += kube.MISSING_TTL_SECONDS
    with pytest.raises(ResourceNotFoundError):
        kube.resource("monitoring.coreos.com/v1", "PodMonitor", lambda: clock[0])
    assert asked == ["Pod", "PodMonitor", "PodMonitor"]


class TimedLeases(MemoryLeases):
    """MemoryLeases that note when the Lease was released."""

    released_at: float | None = None

    def write(self, body: dict[str, Any], timeout: float) -> bool:
        if super().write(body, timeout) and not body["spec"].get("holderIdentity"):
            self.released_at = time.monotonic()
        return self.lease is not None


def test_a_graceful_stop_releases_the_lease_only_after_the_last_turn_returned() -> None:
    """Issue 59, B: on SIGTERM kopf cancels its daemons, not the threads their turns run in,
    and the Lease was released while a turn still ran (released at 0.5 s, the turn done at
    3 s): the successor could act meanwhile. Now the release waits for the turn; one that
    does not return in time is cut short by exiting, the Lease left to expire."""
    import asyncio
    import signal

    from spectune.operator.handlers import Running

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for slow, drain in ((0.5, 5.0), (3.0, 0.3)):
            leases, halted = TimedLeases(), []
            leader = elector(leases, "leader")
            leader.halt = halted.append  # type: ignore[method-assign]
            assert leader.acquire(threading.Event())
            running, ended = Running(), []

            def slow_turn(seconds: float = slow, running: Running = running, ended=ended) -> None:
                with running.turn():
                    time.sleep(seconds)
                    ended.append(time.monotonic())

            async def operate(stop: asyncio.Event) -> None:
                threading.Thread(target=slow_turn, daemon=True).start()
                await asyncio.sleep(0.05)  # kopf stops; the turn's thread runs on

            def drained(timeout: float, running: Running = running, drain: float = drain) -> bool:
                return running.wait_idle(drain)

            asyncio.run(leadership._lead(leader, threading.Event(), operate, drained))
            if slow < drain:
                assert leases.released_at is not None and ended and ended[0] < leases.released_at
                assert leases.holder() == "" and halted == []
            else:  # cut short: exits at once, the Lease held until it expires
                assert leases.released_at is None and not ended and halted == [0]
                assert leases.holder() == "leader"
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def test_a_deleted_lease_is_taken_only_after_the_leader_has_exited() -> None:
    """Issue 59, L: a Lease deleted under its leader was taken at the next poll, while the
    leader counted its exit from its last renewal: up to 8 s of two actors at client-go's
    timings. The candidate now waits a lease duration from when it found it missing."""
    leases, halted = MemoryLeases(), []
    leader, candidate = elector(leases, "leader", halted), elector(leases, "candidate")
    assert leader.acquire(threading.Event())
    lost = threading.Event()
    with leader.holding(on_lost=lost.set):
        time.sleep(0.15)
        leases.lease = None  # kubectl delete lease
        deleted = time.monotonic()
        assert candidate.acquire(threading.Event())
        took = time.monotonic()
    assert lost.is_set() and len(halted) == 1
    assert took >= deleted + FAST.lease_s and took > halted[0]
    assert leases.holder() == "candidate"
