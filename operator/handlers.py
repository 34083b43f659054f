"""kopf handlers: thin shells around tuning (what one turn decides), kube (commit it, apply
the children) and engines (push the settings). Registered at import.

One writer per SpecDeployment: a daemon runs every turn, on a resync period and at once when
the spec changes (the update handler only wakes it). A turn commits status with the
resourceVersion it read, and only then posts Events and moves the engines; a conflict
re-reads and re-decides. A child edited or deleted by hand is repaired at the next turn.

A turn reads the API server only through watches: the SpecDeployment from kopf's live body,
its pods and children from kopf indexes (below). It writes status only when the status
changed, and a child only when its rendered content or the live object moved (`applying`):
a steady fleet costs the API server nothing but the watches.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import logging
import os
import secrets
import socket
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any

import kopf

from spectune.operator import applying, autotune, engines, kube, logs, metrics, render, tuning
from spectune.operator.applying import REPAIR_SECONDS
from spectune.operator.fleet_memory import record_window
from spectune.operator.models import GROUP, PLURAL, VERSION, SpecDeploymentSpec, parse_spec
from spectune.operator.prometheus import PrometheusReader, Selector
from spectune.operator.prometheus_access import OPEN, PrometheusAccess
from spectune.operator.scraping import TargetsCache, why_unscraped
from spectune.operator.status import merge_patched

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
    engines.USER_AGENT[0] = f"spectune-operator ({reporting_instance()})"
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


class NotOwned(Exception):
    """The live object of a child's name is someone else's (`applying.not_owned` says why)."""


def _apply_child(body: dict, child: dict) -> dict:
    """Server-side apply, with an Event when it changed something: drift repaired, or the
    desired state itself moved (a threshold, a spec edit), so the Event does not claim which.
    NotOwned, and nothing applied, where an object of its name is not this SpecDeployment's."""
    meta = body["metadata"]
    before = kube.live_metadata(child)
    if why := applying.not_owned(child["kind"], before, meta.get("uid", ""), meta["name"]):
        raise NotOwned(why)
    kopf.adopt(child, owner=body)
    live = kube.apply(child)
    what = f"{child['kind']} {child['metadata']['name']}"
    if before is None:
        kopf.info(body, reason="Created", message=f"created {what}")
    elif live["metadata"]["resourceVersion"] != before.get("resourceVersion"):
        kopf.info(body, reason="Updated", message=f"updated {what} to the desired state")
    return live


def apply_children(
    body: dict,
    owned: list[dict],
    applied: dict[tuple[str, str], applying.Applied],
    live: Mapping[tuple[str, str], str | None],
    now: float,
) -> applying.Refusal | None:
    """Apply each child that is due (`applying.due`: `applied` is what this process applied
    last, updated here; `live` each watched child's identity), whatever another's apply did;
    what was not applied and why (None: everything applied). A child it refuses (a quota, an
    admission webhook, a field another manager owns) must not keep the engines from their
    settings: they are pushed next, either way. Someone else's object of a child's name is
    reason NotOwned (before any refusal of the API server's: it is the user's to act on)."""
    refused, foreign = [], []
    for child in owned:
        key = (child["kind"], child["metadata"]["name"])
        if not applying.due(child, applied.get(key), live.get(key), now):
            continue
        rendered = applying.digest(child)  # before kopf.adopt adds the owner to it
        try:
            result = _apply_child(body, child)
        except NotOwned as err:
            foreign.append(str(err))
            applied.pop(key, None)
            continue
        except Exception as err:  # the API's errors, a network one: said, not raised
            log.warning("%s %s: apply failed: %s", *key, err)
            refused.append(f"{key[0]} {key[1]}: {_reason(err)}")
            applied.pop(key, None)
            continue
        seen = applying.identity(child["kind"], result["metadata"])
        applied[key] = applying.Applied(rendered, seen, now)
    if foreign:
        return applying.Refusal("NotOwned", "; ".join(foreign + refused))
    return applying.Refusal("ApplyFailed", "; ".join(refused)) if refused else None


def _reason(err: Exception) -> str:
    """The API server's message for a refused request, else the error itself, short."""
    body = getattr(err, "body", None)
    if isinstance(body, (bytes, str)):
        with contextlib.suppress(ValueError, TypeError):
            return str(json.loads(body).get("message", body))[:300]
    return str(err)[:300]


@cache
def prometheus(url: str, access: PrometheusAccess) -> PrometheusReader:
    return PrometheusReader(url, access=access)


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
    reader = prometheus(memo.prometheus_url, memo.get("prometheus_access", OPEN))
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


def push(memo: kopf.Memo, name: str, namespace: str, targets: tuple[tuning.Target, ...]) -> None:
    """Every ready engine to its settings through the admin API (the ConfigMap carries them
    too; this brings each pod there within one turn, and leases exploration)."""
    if not targets or (token := memo.get("token")) is None:
        return
    for target in targets:
        if error := engines.sync(target, token):
            log.warning(
                "%s/%s: admin API: %s (the ConfigMap still carries it)", namespace, name, error
            )
            if error.endswith("HTTP 401"):  # the Secret was made anew: read it again
                memo.token = None


def ensure_token(body: dict, memo: kopf.Memo, now: float) -> str | None:
    """The engines' admin token in `memo.token`: generated once, never overwritten. Read once
    and checked again every REPAIR_SECONDS (a Secret deleted by hand is made anew: the
    engines' pods mount it), not created every turn (a POST that answered 409). A Secret of
    its name that is not this SpecDeployment's is not read: why, as `applying.not_owned`
    says (the engines are then not pushed to), else None."""
    if memo.get("token") is not None and now - memo.get("token_at", 0.0) < REPAIR_SECONDS:
        return None
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    secret = render.child_names(name)["token"]
    found = kube.get("v1", "Secret", namespace, secret)
    if found is None:
        token = render.token_secret(name, namespace, secrets.token_urlsafe(32))
        kopf.adopt(token, owner=body)
        if kube.create_if_absent(token):
            kopf.info(body, reason="Created", message=f"created Secret {secret} (admin token)")
        found = kube.get("v1", "Secret", namespace, secret) or {}
    if why := applying.not_owned("Secret", found.get("metadata"), meta.get("uid", ""), name):
        memo.token = None
        return why
    memo.token = base64.b64decode((found.get("data") or {})[render.TOKEN_KEY]).decode()
    memo.token_at = now
    return None


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


@dataclass(frozen=True)
class View:
    """What the watches show of one SpecDeployment at the start of a turn, taken on kopf's
    loop (where the live body and the indexes change): the object, its pods, its engine
    Deployment's status, and each watched child's identity (`applying.identity`)."""

    body: dict[str, Any]
    pods: list[dict[str, Any]]
    rollout: dict[str, Any]
    children: dict[tuple[str, str], str | None]


def turn(name: str, namespace: str, memo: kopf.Memo, view: View) -> bool:
    """Read, decide, commit, then act. False: another writer moved the object first (nothing
    was acted on; the next turn re-reads)."""
    with TURNS.turn():
        return _turn(name, namespace, memo, view)


def _turn(name: str, namespace: str, memo: kopf.Memo, view: View) -> bool:
    body = view.body
    if not body or body["metadata"].get("deletionTimestamp"):
        return True
    desired = parse_spec(body["spec"])
    status = body.get("status") or {}
    now = datetime.now(UTC).replace(microsecond=0)
    foreign_token = ensure_token(body, memo, now.timestamp())
    state = tuning.saved_state(desired, status)
    observation = observe(memo, name, namespace, desired, state, view.pods, now)
    result = tuning.tune(
        name,
        desired,
        status,
        body["metadata"].get("generation"),
        view.pods,
        view.rollout,
        observation,
        memo.get("exploration_lease", EXPLORATION_LEASE_SECONDS),
        memo.get("apply_error"),
        memo.get("scrape_interval"),
    )
    if merge_patched(status, result.status) == status:
        log.debug("%s/%s: status unchanged, nothing to commit", namespace, name)
    elif not kube.commit_status(body, result.status):
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
    applied = memo.setdefault("applied", {})
    error = apply_children(body, owned, applied, view.children, now.timestamp())
    if foreign_token is not None:
        more = [foreign_token] + ([error.message] if error is not None else [])
        error = applying.Refusal("NotOwned", "; ".join(more))
    if error is not None and error != memo.get("apply_error"):
        kopf.warn(body, reason=error.reason, message=error.message)
    memo.apply_error = error  # the next turn's Degraded condition says so
    push(memo, name, namespace, result.engines)
    log.debug("%s/%s: turn done (%s)", namespace, name, result.state.calibration.phase)
    return True


# --- the watches a turn reads: kopf indexes of the engines' pods and of the children ---------

MANAGED = {render.MANAGED_BY_LABEL: render.MANAGED_BY}


def _owner(labels: Mapping[str, str]) -> str:
    return labels.get(render.INSTANCE_LABEL, "")


def _child(body: kopf.Body) -> dict[str, Any]:
    kind = body["kind"]
    return {"key": (kind, body.metadata.name), "identity": applying.identity(kind, body.metadata)}


@kopf.index("v1", "pods", labels=MANAGED)
def engine_pods(namespace: str, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> dict:
    """Engine pods by (namespace, SpecDeployment): no LIST in every turn."""
    return {(namespace, _owner(labels)): copy.deepcopy(dict(body))}


@kopf.index("apps", "v1", "deployments", labels=MANAGED)
def engine_deployments(
    namespace: str, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict:
    """Engine Deployments: their identity and their status (the rollout's conditions)."""
    status = copy.deepcopy(dict(body.get("status") or {}))
    return {(namespace, _owner(labels)): _child(body) | {"status": status}}


@kopf.index("v1", "configmaps", labels=MANAGED)
def engine_configmaps(namespace: str, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> dict:
    return {(namespace, _owner(labels)): _child(body)}


@kopf.index("v1", "services", labels=MANAGED)
def engine_services(namespace: str, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> dict:
    return {(namespace, _owner(labels)): _child(body)}


CHILD_INDEXES = ("engine_deployments", "engine_configmaps", "engine_services")


def view_of(body: kopf.Body, namespace: str, name: str, indexes: Mapping[str, kopf.Index]) -> View:
    """A snapshot of the watches for one turn (on kopf's loop)."""
    found = {index: list(values.get((namespace, name), [])) for index, values in indexes.items()}
    deployment = ("Deployment", render.child_names(name)["deployment"])
    rollout = next((d["status"] for d in found["engine_deployments"] if d["key"] == deployment), {})
    owned = {c["key"]: c["identity"] for index in CHILD_INDEXES for c in found[index]}
    return View(copy.deepcopy(dict(body)), found["engine_pods"], rollout, owned)


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=RESYNC_SECONDS)
async def tune_continuously(
    name: str,
    namespace: str,
    body: kopf.Body,
    memo: kopf.Memo,
    stopped: kopf.DaemonStopped,
    engine_pods: kopf.Index,
    engine_deployments: kopf.Index,
    engine_configmaps: kopf.Index,
    engine_services: kopf.Index,
    **_: Any,
) -> None:
    """The one writer: a turn every RESYNC_SECONDS, or sooner when woken. An error in a
    turn is logged and the next turn retries: one failed API call must not stop tuning.
    Async, each turn in a thread of its own (the reader and the API client block): a sync
    daemon holds one of kopf's threads for its whole life, and the pool has min(32, CPUs + 4)
    of them, so on 2 cores a seventh SpecDeployment was never tuned. `body` is kopf's live
    view of the object, which its watch keeps current."""
    wake = memo.setdefault("wake", threading.Event())
    indexes = {
        "engine_pods": engine_pods,
        "engine_deployments": engine_deployments,
        "engine_configmaps": engine_configmaps,
        "engine_services": engine_services,
    }
    while not stopped:
        wake.clear()
        view = view_of(body, namespace, name, indexes)
        try:
            done = await asyncio.to_thread(turn, name, namespace, memo, view)
        except Exception:
            log.exception("%s/%s: turn failed; retrying in %.0f s", namespace, name, RESYNC_SECONDS)
            done = True
        pause = RESYNC_SECONDS if done else CONFLICT_RETRY_SECONDS
        waited = 0.0
        while waited < pause and not stopped and not wake.is_set():
            await asyncio.sleep(0.2)
            waited += 0.2
    if stopped.reason is not None and stopped.reason & kopf.DaemonStoppingReason.RESOURCE_DELETED:
        metrics.COUNTERS.forget(namespace, name)  # a deleted SpecDeployment's series go too


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def spec_changed(memo: kopf.Memo, **_: Any) -> None:
    """Wake the daemon: a spec change (a kubectl edit, an HPA's scale) is acted on at once."""
    if (wake := memo.get("wake")) is not None:
        wake.set()
