"""One acting replica: leader election by a coordination.k8s.io/v1 Lease in the operator's own
namespace, and kopf run standalone (no kopf peering) only while this process holds it.

Why a Lease, not kopf's peering: peering needs the cluster-wide ClusterKopfPeering CRD that every
kopf operator shares, which a release can neither own nor delete without harming another
operator; and kopf 1.45 pauses every replica of equal priority. A Lease needs only namespaced
rights in the release's namespace. The decisions, and why two replicas never act at once, are in
lease.py; here are the API calls and the threads around kopf:

- a candidate polls the Lease every retry_s and takes it once free or expired, answering its
  liveness endpoint meanwhile (a standby is healthy and Ready, so a rolling `helm upgrade` goes on
  to stop the old leader);
- the leader renews every renew_s in a thread, through a client of its own with a timeout on
  every call: the operator's dynamic client serialises its discovery behind a lock, and a
  discovery miss re-fetched it with no timeout while a renewal waited (8 s stalled held a
  renewal 8 s past its deadline);
- a watchdog thread, which waits on nothing but the clock, stops kopf at deadline_s after the
  last renewal and exits the process at exit_s, exit status 1, whatever the renewer or a
  handler's thread is stuck in;
- on SIGTERM/SIGINT the leader stops kopf, waits for its handler threads and for the turns still
  running in theirs (kopf cancels a daemon, not the thread its turn runs in), then releases the
  Lease (no holder) so that its successor takes it at once; a turn that does not return in
  time is cut short by exiting at once, the Lease left to expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from spectune.operator.lease import (
    API_VERSION,
    KIND,
    Record,
    Sighting,
    Timing,
    may_take,
    released,
    renewed,
    sight,
    taken,
)

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# An API call that failed or timed out: the next attempt comes after retry_s.
# client-go's leader-election numbers: lease 15 s, renew 5 s (retry 2 s), deadline 10 s.
CLIENT_GO = Timing()
TRANSIENT = (ApiException, urllib3.exceptions.HTTPError, OSError)
# How long a leader told to stop waits for its turns still running before it exits without
# releasing the Lease: under the 30 s a pod is given to terminate.
DRAIN_SECONDS = 20.0


def own_namespace() -> str:
    """The namespace of the operator's credentials, where its Lease lives: the pod's (POD_NAMESPACE
    from the downward API, else its ServiceAccount's), else the kubeconfig context's, as kubectl
    picks it."""
    if namespace := os.environ.get("POD_NAMESPACE"):
        return namespace
    if SERVICE_ACCOUNT_NAMESPACE.exists():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    _, context = config.list_kube_config_contexts(os.environ.get("KUBECONFIG"))
    return context["context"].get("namespace") or "default"


class Leases:
    """The API calls on one Lease, through an API client of their own (`lease_client`), never
    the operator's shared one, each with a timeout; answers as the API server sent them."""

    def __init__(self, namespace: str, name: str, api: client.ApiClient | None = None) -> None:
        self.namespace, self.name = namespace, name
        self.api = client.CoordinationV1Api(api or lease_client())

    def read(self, timeout: float) -> dict[str, Any] | None:
        try:
            answer = self.api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=timeout, _preload_content=False
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return json.loads(answer.data)

    def write(self, body: dict[str, Any], timeout: float) -> bool:
        """Create (no resourceVersion) or replace (with it); False when another write won."""
        options = {"_request_timeout": timeout, "_preload_content": False}
        try:
            if "resourceVersion" in body["metadata"]:
                self.api.replace_namespaced_lease(self.name, self.namespace, body, **options)
            else:
                self.api.create_namespaced_lease(self.namespace, body, **options)
        except ApiException as err:
            if err.status == 409:  # changed since read, or created meanwhile
                return False
            raise
        return True

    def create_released(self, timing: Timing = CLIENT_GO) -> bool:
        """Make the Lease with no holder unless it exists (False then), as the chart does at
        install: the first candidate takes it at once."""
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {"leaseDurationSeconds": timing.lease_s},
        }
        return self.write(body, timing.retry_s)


def lease_client() -> client.ApiClient:
    """In-cluster credentials, else $KUBECONFIG, in a client of its own: its own connection
    pool and no discovery, so that nothing the handlers do can hold a renewal up."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)
    return client.ApiClient(configuration)


class Elector:
    """Takes, renews and releases the Lease for `identity` (see the module's docstring)."""

    def __init__(
        self,
        leases: Leases,
        identity: str,
        timing: Timing = CLIENT_GO,
        clock: Callable[[], float] = time.monotonic,
        halt: Callable[[int], None] = os._exit,
    ) -> None:
        self.leases, self.identity, self.timing = leases, identity, timing
        self.clock, self.halt = clock, halt
        self.renewed_at = 0.0
        self.lost = threading.Event()
        self.kept = threading.Event()
        self._deposing = threading.Lock()

    def acquire(self, stopping: threading.Event) -> bool:
        """Poll until the Lease is ours (True) or `stopping` is set (False)."""
        seen: Sighting | None = None
        log.info("waiting for the Lease %s/%s", self.leases.namespace, self.leases.name)
        while not stopping.is_set():
            sent = self.clock()
            try:
                lease = self.leases.read(self.timing.retry_s)
                record = None if lease is None else Record.of(lease)
                sighted = sight(seen, record, self.clock())
                if record is None and sighted is not seen:
                    log.info(
                        "the Lease does not exist: taking it in %.0f s unless a leader makes it",
                        self.timing.lease_s,
                    )
                seen = sighted
                if may_take(self.identity, record, seen, self.clock(), self.timing.lease_s):
                    body = taken(
                        lease,
                        self.leases.namespace,
                        self.leases.name,
                        self.identity,
                        self.timing,
                        datetime.now(UTC),
                    )
                    if self.leases.write(body, self.timing.retry_s):
                        self.renewed_at = sent
                        log.info("leading: took the Lease as %s", self.identity)
                        return True
            except TRANSIENT as err:
                log.warning("reading the Lease failed (retrying): %s", err)
            stopping.wait(self.timing.retry_s)
        return False

    @contextlib.contextmanager
    def holding(self, on_lost: Callable[[], None]) -> Iterator[None]:
        """Renew the Lease in a thread while the body runs, a watchdog in another; release it
        afterwards unless lost or kept (`keep`). `on_lost` (stop kopf) is called from either
        thread when the Lease is lost."""
        done = threading.Event()
        renewer = threading.Thread(
            target=self._renew, args=(done, on_lost), name="lease-renewer", daemon=True
        )
        watchdog = threading.Thread(
            target=self._watch, args=(done, on_lost), name="lease-watchdog", daemon=True
        )
        renewer.start()
        watchdog.start()
        try:
            yield
        finally:
            done.set()
            renewer.join(self.timing.retry_s + 1)  # its calls time out within retry_s
            if not self.lost.is_set() and not self.kept.is_set():
                self._release()

    def keep(self) -> None:
        """Leave the Lease held when done: a turn may still write, so the successor must wait
        for it to expire (the process exits first)."""
        self.kept.set()

    def _renew(self, done: threading.Event, on_lost: Callable[[], None]) -> None:
        pause = self.timing.renew_s
        while not done.wait(pause) and not self.lost.is_set():
            sent = self.clock()
            try:
                why = self._renew_once(sent)
            except TRANSIENT as err:
                log.warning("renewing the Lease failed (retrying): %s", err)
                why = None
            if why is not None:
                return self._depose(why, on_lost)
            if self.renewed_at == sent:
                pause = self.timing.renew_s
            else:  # retry, but wake at the deadline at the latest
                left = self.renewed_at + self.timing.deadline_s - self.clock()
                pause = max(0.0, min(self.timing.retry_s, left))

    def _renew_once(self, sent: float) -> str | None:
        """One renewal: read, then write the renewTime; why to stop acting, if so."""
        if (timeout := self.timing.attempt_timeout(self.renewed_at, sent)) is None:
            return None  # the watchdog stops kopf at the deadline
        lease = self.leases.read(timeout)
        if lease is None or Record.of(lease).holder != self.identity:
            return "another replica holds it" if lease else "it was deleted"
        if (timeout := self.timing.attempt_timeout(self.renewed_at, self.clock())) is None:
            return None
        if self.leases.write(renewed(lease, datetime.now(UTC)), timeout):
            self.renewed_at = sent
        return None

    def _watch(self, done: threading.Event, on_lost: Callable[[], None]) -> None:
        """Stop kopf at deadline_s after the last renewal, exit at exit_s, on the clock alone.
        Runs until the leader is done, or, once it lost the Lease, until the exit."""
        while not done.is_set() or self.lost.is_set():
            now = self.clock()
            if now >= self.renewed_at + self.timing.exit_s:
                log.error("the Lease was not renewed within %.0f s: exiting", self.timing.exit_s)
                self.halt(1)
                return
            if now >= self.renewed_at + self.timing.deadline_s and not self.lost.is_set():
                self._depose("not renewed in time", on_lost)
            due = self.renewed_at + (
                self.timing.exit_s if self.lost.is_set() else self.timing.deadline_s
            )
            time.sleep(max(0.0, min(self.timing.retry_s, due - self.clock())) + 0.001)

    def _depose(self, why: str, on_lost: Callable[[], None]) -> None:
        """Stop acting: kopf now; the watchdog exits the process at exit_s after the last
        renewal, before any other replica may take the Lease."""
        with self._deposing:
            if self.lost.is_set():
                return
            self.lost.set()
        log.error("lost the Lease (%s): stopping", why)
        on_lost()

    def _release(self) -> None:
        try:
            lease = self.leases.read(self.timing.retry_s)
            if lease is not None and Record.of(lease).holder == self.identity:
                self.leases.write(released(lease, datetime.now(UTC)), self.timing.retry_s)
                log.info("released the Lease")
        except TRANSIENT as err:  # the successor waits for it to expire instead
            log.warning("releasing the Lease failed: %s", err)


@contextlib.contextmanager
def standby_health(endpoint: str) -> Iterator[None]:
    """Answer `endpoint` (kopf's liveness URL) with 200 while waiting for the Lease: kopf serves
    it once leading."""
    url = urllib.parse.urlsplit(endpoint)

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == url.path else 404)
            self.end_headers()

        def log_message(self, *_: Any) -> None:  # probes every few seconds: not worth a line
            pass

    server = ThreadingHTTPServer((url.hostname or "", url.port or 80), Health)
    threading.Thread(target=server.serve_forever, name="standby-health", daemon=True).start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


async def take_signals_back(stop: asyncio.Event, ready: asyncio.Event) -> None:
    """Once kopf has started (`ready`), SIGTERM and SIGINT set `stop` again. kopf answers them
    with a flag of its own, and then waits 5 s for its waiter on `stop`, which nothing set,
    before cancelling it: every exit, a rolling upgrade's included, took 5 s longer."""
    await ready.wait()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)


def _on_stop_signals(stop: Callable[[], None]) -> None:
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop())


def run_elected(
    elector: Elector,
    liveness: str,
    operate: Callable[[asyncio.Event], Awaitable[None]],
    drained: Callable[[float], bool] = lambda timeout: True,
) -> int:
    """Wait for the Lease, then run `operate(stop)` (kopf, stopping when `stop` is set) while
    holding it; `drained(timeout)` waits for work still running in threads (the turns) once
    kopf has stopped. The exit status: 0 after a signal, 1 when the Lease was lost."""
    stopping = threading.Event()
    _on_stop_signals(stopping.set)
    with standby_health(liveness):
        if not elector.acquire(stopping):
            return 0
    asyncio.run(_lead(elector, stopping, operate, drained))
    return 1 if elector.lost.is_set() else 0


async def _lead(
    elector: Elector,
    stopping: threading.Event,
    operate: Callable[[asyncio.Event], Awaitable[None]],
    drained: Callable[[float], bool],
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def halt() -> None:
        loop.call_soon_threadsafe(stop.set)

    _on_stop_signals(halt)  # until kopf takes the signals over
    if stopping.is_set():  # a signal came while taking the Lease
        halt()
    with elector.holding(on_lost=halt):
        await operate(stop)
        if not await asyncio.to_thread(drained, DRAIN_SECONDS):
            log.error("a turn still runs %.0f s after kopf stopped: exiting", DRAIN_SECONDS)
            elector.keep()
    if elector.kept.is_set():
        elector.halt(0)  # the turn's thread dies with the process: it writes nothing more
