"""kopf handlers: thin shells around render (what the children are), kube (apply them)
and status (what to report). Registered at import.

Create, update, resume and a periodic resync all run the same idempotent reconcile,
so a child edited or deleted by hand is repaired at the next resync.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from datetime import UTC, datetime
from functools import cache
from typing import Any

import kopf

from spectune.operator import autotune, engines, kube, logs, metrics, render
from spectune.operator.models import (
    GROUP,
    PLURAL,
    VERSION,
    SpecDeploymentSpec,
    SpecDeploymentStatus,
    parse_spec,
)
from spectune.operator.prometheus import (
    PrometheusReader,
    PrometheusUnavailable,
    Selector,
)
from spectune.operator.status import (
    condition,
    merge_patch,
    prometheus_down,
    rollout_conditions,
    threshold_status,
    unready_pods,
)

RESYNC_SECONDS = 10.0
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
    threshold: int | None,
    exploration: int,
    pod_monitor: bool = True,
) -> list[dict]:
    config = render.engine_config(spec, threshold, exploration)
    objs = [
        render.config_map(name, namespace, config),
        render.deployment(name, namespace, spec, config),
        render.service(name, namespace, spec),
    ]
    if pod_monitor and kube.api_available("monitoring.coreos.com/v1", "PodMonitor"):
        objs.append(render.pod_monitor(name, namespace))
    return objs


def _apply_child(body: kopf.Body, child: dict) -> dict:
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


@cache
def prometheus(url: str) -> PrometheusReader:
    return PrometheusReader(url)


def observe(
    memo: kopf.Memo,
    name: str,
    namespace: str,
    spec: SpecDeploymentSpec,
    state: autotune.State,
    pods: list[dict],
    now: datetime,
) -> autotune.Observation:
    """Read this SpecDeployment's engines from Prometheus (blocking: a sync handler)."""
    unready = unready_pods(pods)
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    ready = len(live) - len(unready)
    settled = ready == spec.replicas == len(live)
    seconds = autotune.window_seconds(spec, state.calibration, now)
    try:
        window = prometheus(memo.prometheus_url).read(
            Selector(namespace, name, memo.prometheus_labels), seconds
        )
    except PrometheusUnavailable as err:
        return autotune.Observation(now, ready, settled, None, error=str(err))
    if state.calibration.phase == "Idle":
        memo.traffic = autotune.record_window(memo.get("traffic", []), now, window.traffic)
    return autotune.Observation(now, ready, settled, window, memo.get("traffic", []))


def push(
    name: str,
    namespace: str,
    spec: SpecDeploymentSpec,
    state: autotune.State,
    pods: list[dict],
    skus: dict[str, str],
) -> None:
    """Every ready engine to its SKU's threshold and the phase's exploration (admin API);
    `skus`: pod -> SKU, where known."""
    token = kube.secret_value(namespace, render.child_names(name)["token"], render.TOKEN_KEY)
    unready = {u.split(":", 1)[0] for u in unready_pods(pods)}
    for pod in pods:
        pod_name, ip = pod["metadata"]["name"], (pod.get("status") or {}).get("podIP")
        if pod_name in unready or not ip or pod["metadata"].get("deletionTimestamp"):
            continue
        threshold, percent = autotune.engine_settings(spec, state, skus.get(pod_name))
        url = f"http://{ip}:{spec.engine.port}"
        error = engines.sync(engines.Target(pod_name, url, threshold, percent / 100), token)
        if error:
            log.warning(
                "%s/%s: admin API: %s (the ConfigMap still carries it)", namespace, name, error
            )


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
@kopf.timer(GROUP, VERSION, PLURAL, interval=RESYNC_SECONDS, idle=0)
def reconcile(
    body: kopf.Body,
    spec: kopf.Spec,
    name: str,
    namespace: str,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    desired = parse_spec(dict(spec))
    saved = SpecDeploymentStatus.model_validate(dict(status))
    state = autotune.State(
        threshold=threshold_status(desired, saved.threshold),
        crossover=saved.crossover,
        per_sku=tuple(saved.perSku),
        calibration=saved.calibration,
    )
    token = render.token_secret(name, namespace, secrets.token_urlsafe(32))
    kopf.adopt(token, owner=body)
    if kube.create_if_absent(token):
        kopf.info(
            body,
            reason="Created",
            message=f"created Secret {token['metadata']['name']} (admin token)",
        )
    now = datetime.now(UTC).replace(microsecond=0)
    pods = kube.list_pods(namespace, render.selector_string(name))
    observation = None
    if desired.speculation.threshold.mode != "Manual" or state.calibration.phase != "Idle":
        observation = observe(memo, name, namespace, desired, state, pods, now)
        tuned = autotune.step(desired, state, observation)
        metrics.COUNTERS.record(namespace, name, state, observation, tuned)
        state = tuned.state
        for event in tuned.events:
            post = kopf.warn if event.warning else kopf.info
            post(body, reason=event.reason, message=event.message)
    live = {
        c["kind"]: _apply_child(body, c)
        for c in children(
            name,
            namespace,
            desired,
            *autotune.engine_settings(desired, state, None),
            pod_monitor=memo.get("engine_pod_monitors", True),
        )
    }
    if desired.speculation.threshold.mode != "Manual":
        memo.skus = autotune.pod_skus(
            memo.get("skus", {}),
            observation and observation.window,
            (p["metadata"]["name"] for p in pods),
        )
        push(name, namespace, desired, state, pods, memo.skus)
    rollout = live["Deployment"].get("status") or {}
    unready = unready_pods(pods)
    previous = list(status.get("conditions") or [])
    conditions = rollout_conditions(desired.replicas, rollout, unready, previous, now)
    conditions.append(condition("Calibrated", *autotune.calibrated(desired, state), now, previous))
    if observation is not None and observation.error:
        conditions = prometheus_down(conditions, observation.error, now, previous)
    patch.status.update(
        {
            "observedGeneration": body.metadata.get("generation"),
            "replicas": rollout.get("replicas") or 0,
            "readyReplicas": rollout.get("readyReplicas") or 0,
            "selector": render.selector_string(name),
            "threshold": state.threshold.model_dump(),
            # None deletes a field in a merge patch: a crossover no longer crossed loses its
            # batch size, and its curve the buckets this measurement did not reach (nulls
            # inside lists would not validate, so theirs are left out)
            "crossover": merge_patch(status.get("crossover"), state.crossover.model_dump()),
            "perSku": [s.model_dump(exclude_none=True) for s in state.per_sku],
            "calibration": merge_patch(
                status.get("calibration"), state.calibration.model_dump(exclude_none=True)
            ),
            "conditions": [c.model_dump(mode="json", exclude_none=True) for c in conditions],
        }
    )
