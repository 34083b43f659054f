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
- the leader renews every renew_s in a thread; failing that until deadline_s it stops kopf, and
  at exit_s it exits the process, exit status 1 either way;
- on SIGTERM/SIGINT the leader stops kopf, waits for its handler threads, then releases the Lease
  (no holder) so that its successor takes it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from kubernetes import config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import ConflictError, NotFoundError

from spectune.operator import kube
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
    """The API calls on one Lease, through the operator's dynamic client."""

    def __init__(self, namespace: str, name: str) -> None:
        self.namespace, self.name = namespace, name

    def read(self, timeout: float) -> dict[str, Any] | None:
        try:
            lease = kube.resource(API_VERSION, KIND).get(
                name=self.name, namespace=self.namespace, _request_timeout=timeout
            )
        except NotFoundError:
            return None
        return lease.to_dict()

    def write(self, body: dict[str, Any], timeout: float) -> bool:
        """Create (no resourceVersion) or replace (with it); False when another write won."""
        leases = kube.resource(API_VERSION, KIND)
        call = leases.replace if "resourceVersion" in body["metadata"] else leases.create
        try:
            call(body=body, namespace=self.namespace, _request_timeout=timeout)
        except ConflictError:  # 409: changed since read, or created meanwhile
            return False
        return True


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

    def acquire(self, stopping: threading.Event) -> bool:
        """Poll until the Lease is ours (True) or `stopping` is set (False)."""
        seen: Sighting | None = None
        log.info("waiting for the Lease %s/%s", self.leases.namespace, self.leases.name)
        while not stopping.is_set():
            sent = self.clock()
            try:
                lease = self.leases.read(self.timing.retry_s)
                if lease is not None:
                    record = Record.of(lease)
                    seen = sight(seen, record, self.clock())
                if lease is None or may_take(self.identity, record, seen, self.clock()):
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
        """Renew the Lease in a thread while the body runs; release it afterwards unless lost.
        `on_lost` (stop kopf) is called from that thread when the Lease is lost."""
        done = threading.Event()
        renewer = threading.Thread(
            target=self._renew, args=(done, on_lost), name="lease-renewer", daemon=True
        )
        renewer.start()
        try:
            yield
        finally:
            done.set()
            renewer.join()
            if not self.lost.is_set():
                self._release()

    def _renew(self, done: threading.Event, on_lost: Callable[[], None]) -> None:
        pause = self.timing.renew_s
        while not done.wait(pause):
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
            return "not renewed in time"
        lease = self.leases.read(timeout)
        if lease is None or Record.of(lease).holder != self.identity:
            return "another replica holds it"
        if (timeout := self.timing.attempt_timeout(self.renewed_at, self.clock())) is None:
            return "not renewed in time"
        if self.leases.write(renewed(lease, datetime.now(UTC)), timeout):
            self.renewed_at = sent
        return None

    def _depose(self, why: str, on_lost: Callable[[], None]) -> None:
        """Stop acting: kopf now, the whole process at exit_s after the last renewal, before
        any other replica may take the Lease."""
        self.lost.set()
        log.error("lost the Lease (%s): stopping", why)
        on_lost()
        exit_in = max(0.0, self.renewed_at + self.timing.exit_s - self.clock())
        timer = threading.Timer(exit_in, self.halt, (1,))
        timer.daemon = True
        timer.start()

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
    elector: Elector, liveness: str, operate: Callable[[asyncio.Event], Awaitable[None]]
) -> int:
    """Wait for the Lease, then run `operate(stop)` (kopf, stopping when `stop` is set) while
    holding it. The exit status: 0 after a signal, 1 when the Lease was lost."""
    stopping = threading.Event()
    _on_stop_signals(stopping.set)
    with standby_health(liveness):
        if not elector.acquire(stopping):
            return 0
    asyncio.run(_lead(elector, stopping, operate))
    return 1 if elector.lost.is_set() else 0


async def _lead(
    elector: Elector,
    stopping: threading.Event,
    operate: Callable[[asyncio.Event], Awaitable[None]],
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
