"""Applying rendered children to the API server: server-side apply under one field
manager, so re-applying is idempotent and undoes hand edits of the fields we own."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ConflictError, NotFoundError, ResourceNotFoundError
from kubernetes.dynamic.resource import Resource

FIELD_MANAGER = "spectune-operator"


_DYNAMIC = threading.Lock()
# How long a kind the cluster does not serve is taken as absent before discovery is asked
# again (a PodMonitor CRD installed later is found within this).
MISSING_TTL_SECONDS = 300.0
_FOUND: dict[tuple[str, str], Resource] = {}
_MISSING: dict[tuple[str, str], float] = {}


def resource(api_version: str, kind: str, now: Callable[[], float] = time.monotonic) -> Resource:
    """A resource of the one dynamic client, from this process's own cache of what discovery
    found (and did not: for MISSING_TTL_SECONDS). The client's discovery, on a miss, throws its
    whole cache away and fetches it anew (about six GETs and a file write) with no timeout,
    under a lock: every turn asked for the PodMonitor kind, and a cluster that does not serve it
    paid that each time. Looked up under that lock: sync handlers run on several threads, and
    discovery writes its cache while it looks up (two lookups at once half-wrote it, seen:
    KeyError 'resources'). ResourceNotFoundError for a kind not served."""
    key = (api_version, kind)
    with _DYNAMIC:
        if (found := _FOUND.get(key)) is not None:
            return found
        if (missed := _MISSING.get(key)) is not None and now() - missed < MISSING_TTL_SECONDS:
            raise ResourceNotFoundError(f"{kind} ({api_version}) is not served")
        try:
            found = _make_dynamic().resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:
            _MISSING[key] = now()
            raise
        _MISSING.pop(key, None)
        _FOUND[key] = found
        return found


@cache
def _make_dynamic() -> DynamicClient:
    """In-cluster credentials, else $KUBECONFIG. Its discovery cache file is per process:
    replicas sharing one file read each other's half-writes."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    cache_file = Path(tempfile.gettempdir()) / f"spectune-operator-discovery-{os.getpid()}.json"
    return DynamicClient(client.ApiClient(), cache_file=str(cache_file))


def _resource(obj: dict[str, Any]) -> Resource:
    return resource(obj["apiVersion"], obj["kind"])


def live_metadata(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The live object's metadata (owners, labels, resourceVersion), or None when it does not
    exist."""
    meta = obj["metadata"]
    try:
        live = _resource(obj).get(name=meta["name"], namespace=meta.get("namespace"))
    except NotFoundError:
        return None
    return live.to_dict()["metadata"]


def get(api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """The live object as a plain dict, or None when it does not exist."""
    try:
        return resource(api_version, kind).get(name=name, namespace=namespace).to_dict()
    except NotFoundError:
        return None


def commit_status(obj: dict[str, Any], status: dict[str, Any]) -> bool:
    """Merge-patch `status` onto the status subresource of `obj` as it was read: the patch
    carries its resourceVersion, so the API server refuses it (False) when anything wrote the
    object since, and the caller re-reads and re-decides instead of overwriting."""
    meta = obj["metadata"]
    body = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status}
    try:
        _resource(obj).status.patch(
            body=body,
            name=meta["name"],
            namespace=meta.get("namespace"),
            content_type="application/merge-patch+json",
        )
    except ConflictError:
        return False
    return True


def apply(obj: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply; returns the live object."""
    meta = obj["metadata"]
    live = _resource(obj).server_side_apply(
        body=obj,
        name=meta["name"],
        namespace=meta.get("namespace"),
        field_manager=FIELD_MANAGER,
        force_conflicts=True,
    )
    return live.to_dict()


def create_if_absent(obj: dict[str, Any]) -> bool:
    """Create obj unless it exists (never overwrite: a generated secret must stay stable)."""
    meta = obj["metadata"]
    try:
        _resource(obj).create(body=obj, namespace=meta.get("namespace"))
    except ApiException as err:
        if err.status == 409:
            return False
        raise
    return True


def list_pods(namespace: str, label_selector: str) -> list[dict[str, Any]]:
    """The pods matching a selector, as plain dicts."""
    pods = resource("v1", "Pod")
    return pods.get(namespace=namespace, label_selector=label_selector).to_dict()["items"]


def api_available(api_version: str, kind: str) -> bool:
    """Whether the cluster serves this kind (e.g. PodMonitor only with the Prometheus operator)."""
    try:
        resource(api_version, kind)
    except ResourceNotFoundError:
        return False
    return True
