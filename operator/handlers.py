"""kopf handlers: thin shells around tuning (what one turn decides), kube (commit it, apply
the children) and engines (push the settings). Registered at import.

One writer per SpecDeployment: a daemon runs every turn, on a resync period and at once when
the spec changes (the update handler only wakes it). A turn commits status with the
resourceVersion it read, and only then posts Events and moves the engines; a conflict
re-reads and re-decides. A child edited or deleted by hand is repaired at the next turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import cache
from typing import Any

import kopf

from spectune.operator import autotune, engines, kube, logs, metrics, render, tuning
from spectune.operator.fleet_memory import record_window
from spectune.operator.models import GROUP, KIND, PLURAL, VERSION, SpecDeploymentSpec, parse_spec
from spectune.operator.prometheus import PrometheusReader, Selector
from spectune.operator.scraping import TargetsCache, why_unscraped

RESYNC_SECONDS = 10.0
# A conflict (another writer moved the object since it was read): the next turn comes soon.
CONFLICT_RETRY_SECONDS = 1.0
# Raised exploration expires this long after the last turn that renewed it (--exploration-lease).
EXPLORATION_LEASE_SECONDS = 60.0
ANNOTATION_PREFIX = "spectune.io"


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Keep kopf's bookkeeping in annotations: the status schema is ours and strict.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX
    )
    settings.posting.level = 20  # INFO: Events tell users what the operator did
    settings.posting.reporting_instance = reporting_instance()
    logs.demote_handler_successes()


def reporting_instance() -> str:
    """Which replica posted an Event: the pod's name (its hostname), and the process, as
    replicas outside a cluster share one host."""
    return f"{socket.gethostname()}-{os.getpid()}"


log = logging.getLogger(__name__)


def children(
    name: str,
    namespace: str,
    spec: SpecDeploymentSpec,
    config: dict,
    pod_monitor: render.PodMonitorSettings | None = render.DEFAULT_POD_MONITOR,
    monitors_served: bool = False,
    scrape_annotations: bool = False,
    engine_image: str = render.ENGINE_IMAGE,
) -> list[dict]:
    """The objects a SpecDeployment owns. Where the cluster serves PodMonitors
    (`monitors_served`), a PodMonitor scrapes the engines: ours unless `pod_monitor` is None
    (one for every engine exists, the chart's), and the pods carry no scrape annotations, so
    that nothing scrapes them twice, unless `scrape_annotations` asks for them anyway (a
    Prometheus that discovers by annotation next to the Prometheus Operator's CRDs).
    `engine_image` runs where spec.engine.image is unset."""
    annotate = scrape_annotations or not monitors_served
    objs = [
        render.config_map(name, namespace, config),
        render.deployment(name, namespace, spec, config, annotate, engine_image),
        render.service(name, namespace, spec),
    ]
    if pod_monitor and monitors_served:
        objs.append(render.pod_monitor(name, namespace, pod_monitor))
    return objs


def _apply_child(body: dict, child: dict) -> dict:
    """Server-side apply, with an Event when it changed something: drift repaired, or the
    desired state itself moved (exploration raised for a calibration, a threshold, a spec edit),
    so the Event does not claim which."""
    kopf.adopt(child, owner=body)
    before = kube.resource_version(child)
    live = kube.apply(child)
    what = f"{child['kind']} {child['metadata']['name']}"
    if before is None:
        kopf.info(body, reason="Created", message=f"created {what}")
    elif live["metadata"]["resourceVersion"] != before:
        kopf.info(body, reason="Updated", message=f"updated {what} to the desired state")
    return live


def apply_children(body: dict, owned: list[dict]) -> str | None:
    """Apply each child, whatever another's apply did; what the API server refused, as text
    (None: everything applied). A child it refuses (a quota, an admission webhook, a field
    another manager owns) must not keep the engines from their settings: they are pushed
    next, either way."""
    refused = []
    for child in owned:
        try:
            _apply_child(body, child)
        except Exception as err:  # the API's errors, a network one: said, not raised
            log.warning("%s %s: apply failed: %s", child["kind"], child["metadata"]["name"], err)
            refused.append(f"{child['kind']} {child['metadata']['name']}: {_reason(err)}")
    return "; ".join(refused) or None


def _reason(err: Exception) -> str:
    """The API server's message for a refused request, else the error itself, short."""
    body = getattr(err, "body", None)
    if isinstance(body, (bytes, str)):
        with contextlib.suppress(ValueError, TypeError):
            return str(json.loads(body).get("message", body))[:300]
    return str(err)[:300]


@cache
def prometheus(url: str) -> PrometheusReader:
    return PrometheusReader(url)


@cache
def targets_of(url: str) -> TargetsCache:
    """One targets cache per Prometheus, for every SpecDeployment read from it."""
    return TargetsCache()


def observe(
    memo: kopf.Memo,
    name: str,
    namespace: str,
    spec: SpecDeploymentSpec,
    state: autotune.State,
    pods: list[dict],
    now: datetime,
) -> autotune.Observation:
    """Read this SpecDeployment's engines from Prometheus (blocking: the daemon's thread)."""
    names = tuple(sorted(p["metadata"]["name"] for p in pods))
    selector = Selector(namespace, names, memo.prometheus_labels)
    reader = prometheus(memo.prometheus_url)
    interval = memo.get("scrape_interval")
    seen = tuning.observe(
        spec,
        state,
        pods,
        now,
        lambda seconds: reader.read(selector, seconds),
        memo.get("traffic", []),
        selector.matchers(),
        interval,
        lambda pods: why_unscraped(
            targets_of(memo.prometheus_url).get(now.timestamp(), reader.targets),
            pods,
            namespace,
            selector.labels,
        ),
    )
    memo.scrape_interval = seen.scrape_interval_or(interval)
    return seen


def push(name: str, namespace: str, targets: tuple[tuning.Target, ...]) -> None:
    """Every ready engine to its settings through the admin API (the ConfigMap carries them
    too; this brings each pod there within one turn, and leases exploration)."""
    if not targets:
        return
    try:
        token = kube.secret_value(namespace, render.child_names(name)["token"], render.TOKEN_KEY)
    except Exception as err:  # the engines keep what the ConfigMap says; said, not raised
        log.warning("%s/%s: no admin token to push with: %s", namespace, name, _reason(err))
        return
    for target in targets:
        if error := engines.sync(target, token):
            log.warning(
                "%s/%s: admin API: %s (the ConfigMap still carries it)", namespace, name, error
            )


def ensure_token(body: dict) -> None:
    """The engines' admin token: generated once, never overwritten."""
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    token = render.token_secret(name, namespace, secrets.token_urlsafe(32))
    kopf.adopt(token, owner=body)
    if kube.create_if_absent(token):
        kopf.info(
            body,
            reason="Created",
            message=f"created Secret {token['metadata']['name']} (admin token)",
        )


class Running:
    """The turns running in their threads. kopf stops by cancelling its daemons, which stops
    none of the threads their turns run in: the Lease is released only once none is left
    (a successor must not act while this process may still write)."""

    def __init__(self) -> None:
        self._count = 0
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        with self._changed:
            self._count += 1
        try:
            yield
        finally:
            with self._changed:
                self._count -= 1
                self._changed.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """True once no turn runs (within `timeout` seconds), else False."""
        with self._changed:
            return self._changed.wait_for(lambda: self._count == 0, timeout)


TURNS = Running()


def turn(name: str, namespace: str, memo: kopf.Memo) -> bool:
    """Read, decide, commit, then act. False: another writer moved the object first (nothing
    was acted on; the next turn re-reads)."""
    with TURNS.turn():
        return _turn(name, namespace, memo)


def _turn(name: str, namespace: str, memo: kopf.Memo) -> bool:
    body = kube.get(f"{GROUP}/{VERSION}", KIND, namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return True
    desired = parse_spec(body["spec"])
    status = body.get("status") or {}
    ensure_token(body)
    now = datetime.now(UTC).replace(microsecond=0)
    pods = kube.list_pods(namespace, render.selector_string(name))
    state = tuning.saved_state(desired, status)
    observation = observe(memo, name, namespace, desired, state, pods, now)
    deployment = kube.get(
        "apps/v1", "Deployment", namespace, render.child_names(name)["deployment"]
    )
    result = tuning.tune(
        name,
        desired,
        status,
        body["metadata"].get("generation"),
        pods,
        (deployment or {}).get("status") or {},
        observation,
        memo.get("exploration_lease", EXPLORATION_LEASE_SECONDS),
        memo.get("apply_error"),
    )
    if not kube.commit_status(body, result.status):
        # routine: kopf writes its finalizer and annotations to a new object, an HPA scales
        log.debug("%s/%s: changed since read; re-reading before acting", namespace, name)
        return False
    if observation.window is not None and result.state.calibration.phase == "Idle":
        memo.traffic = record_window(memo.get("traffic", []), now, observation.window.traffic)
    metrics.COUNTERS.record(
        namespace, name, state, observation, autotune.Step(result.state, result.events)
    )
    for event in result.events:
        post = kopf.warn if event.warning else kopf.info
        post(body, reason=event.reason, message=event.message)
    owned = children(
        name,
        namespace,
        desired,
        result.config,
        pod_monitor=memo.get("pod_monitors", render.DEFAULT_POD_MONITOR),
        monitors_served=kube.api_available("monitoring.coreos.com/v1", "PodMonitor"),
        scrape_annotations=memo.get("scrape_annotations", False),
        engine_image=memo.get("engine_image") or render.ENGINE_IMAGE,
    )
    error = apply_children(body, owned)
    if error is not None and error != memo.get("apply_error"):
        kopf.warn(body, reason="ApplyFailed", message=error)
    memo.apply_error = error  # the next turn's Degraded condition says so
    push(name, namespace, result.engines)
    log.debug("%s/%s: turn committed (%s)", namespace, name, result.state.calibration.phase)
    return True


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=RESYNC_SECONDS)
async def tune_continuously(
    name: str, namespace: str, memo: kopf.Memo, stopped: kopf.DaemonStopped, **_: Any
) -> None:
    """The one writer: a turn every RESYNC_SECONDS, or sooner when woken. An error in a
    turn is logged and the next turn retries: one failed API call must not stop tuning.
    Async, each turn in a thread of its own (the reader and the API client block): a sync
    daemon holds one of kopf's threads for its whole life, and the pool has min(32, CPUs + 4)
    of them, so on 2 cores a seventh SpecDeployment was never tuned."""
    wake = memo.setdefault("wake", threading.Event())
    while not stopped:
        wake.clear()
        try:
            done = await asyncio.to_thread(turn, name, namespace, memo)
        except Exception:
            log.exception("%s/%s: turn failed; retrying in %.0f s", namespace, name, RESYNC_SECONDS)
            done = True
        pause = RESYNC_SECONDS if done else CONFLICT_RETRY_SECONDS
        waited = 0.0
        while waited < pause and not stopped and not wake.is_set():
            await asyncio.sleep(0.2)
            waited += 0.2


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def spec_changed(memo: kopf.Memo, **_: Any) -> None:
    """Wake the daemon: a spec change (a kubectl edit, an HPA's scale) is acted on at once."""
    if (wake := memo.get("wake")) is not None:
        wake.set()
