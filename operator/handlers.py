"""kopf handlers: thin shells around render (what the children are), kube (apply them)
and status (what to report). Registered at import.

Create, update, resume and a periodic resync all run the same idempotent reconcile,
so a child edited or deleted by hand is repaired at the next resync.
"""

from __future__ import annotations

import os
import secrets
import socket
from datetime import UTC, datetime
from typing import Any

import kopf

from spectune.operator import kube, logs, render
from spectune.operator.models import (
    GROUP,
    PLURAL,
    VERSION,
    SpecDeploymentSpec,
    ThresholdStatus,
    parse_spec,
)
from spectune.operator.status import rollout_conditions, threshold_status, unready_pods

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


def children(
    name: str, namespace: str, spec: SpecDeploymentSpec, threshold: int | None
) -> list[dict]:
    config = render.engine_config(spec, threshold, spec.tuning.explorationPercent)
    objs = [
        render.config_map(name, namespace, config),
        render.deployment(name, namespace, spec, config),
        render.service(name, namespace, spec),
    ]
    if kube.api_available("monitoring.coreos.com/v1", "PodMonitor"):
        objs.append(render.pod_monitor(name, namespace))
    return objs


def _apply_child(body: kopf.Body, child: dict) -> dict:
    kopf.adopt(child, owner=body)
    before = kube.resource_version(child)
    live = kube.apply(child)
    what = f"{child['kind']} {child['metadata']['name']}"
    if before is None:
        kopf.info(body, reason="Created", message=f"created {what}")
    elif live["metadata"]["resourceVersion"] != before:
        kopf.info(body, reason="Updated", message=f"brought {what} back to the desired state")
    return live


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
    **_: Any,
) -> None:
    desired = parse_spec(dict(spec))
    threshold = threshold_status(
        desired, ThresholdStatus.model_validate(dict(status.get("threshold") or {}))
    )
    token = render.token_secret(name, namespace, secrets.token_urlsafe(32))
    kopf.adopt(token, owner=body)
    if kube.create_if_absent(token):
        kopf.info(
            body,
            reason="Created",
            message=f"created Secret {token['metadata']['name']} (admin token)",
        )
    live = {
        c["kind"]: _apply_child(body, c)
        for c in children(name, namespace, desired, threshold.current)
    }
    rollout = live["Deployment"].get("status") or {}
    now = datetime.now(UTC).replace(microsecond=0)
    unready = unready_pods(kube.list_pods(namespace, render.selector_string(name)))
    conditions = rollout_conditions(
        desired.replicas, rollout, unready, list(status.get("conditions") or []), now
    )
    patch.status.update(
        {
            "observedGeneration": body.metadata.get("generation"),
            "replicas": rollout.get("replicas") or 0,
            "readyReplicas": rollout.get("readyReplicas") or 0,
            "selector": render.selector_string(name),
            "threshold": threshold.model_dump(),
            "conditions": [c.model_dump(mode="json", exclude_none=True) for c in conditions],
        }
    )
