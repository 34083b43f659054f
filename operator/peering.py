"""The ClusterKopfPeering the operator's replicas meet in, made by the operator itself.

kopf pauses until its peering object exists, and a Helm chart cannot ship one as a plain
template (its CRD is a template of the same release) nor delete a hook's object on uninstall.
So the operator creates it when missing, owned by the ClusterRole that grants the operator its
rights: deleting that role (`helm uninstall`) garbage-collects the peering with it.
"""

from __future__ import annotations

import logging
from typing import Any

from spectune.operator import kube

log = logging.getLogger(__name__)

CLUSTER_ROLE = ("rbac.authorization.k8s.io/v1", "ClusterRole")


def render(name: str, owner: dict[str, str] | None = None) -> dict[str, Any]:
    """The peering object; `owner` is a ClusterRole's reference (name, uid) or None."""
    metadata: dict[str, Any] = {"name": name}
    if owner is not None:
        api_version, kind = CLUSTER_ROLE
        metadata["ownerReferences"] = [{"apiVersion": api_version, "kind": kind, **owner}]
    return {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": metadata}


def ensure(name: str, owner_cluster_role: str | None) -> None:
    """Create the peering when missing (server-side apply: idempotent across replicas). With an
    owner, its reference is applied too, so a peering an older release made as a hook is
    adopted and collected with the role."""
    owner = None
    if owner_cluster_role is not None:
        role = kube.resource(*CLUSTER_ROLE).get(name=owner_cluster_role)
        owner = {"name": owner_cluster_role, "uid": role.metadata.uid}
    kube.apply(render(name, owner))
    log.info("the ClusterKopfPeering %s is in place (owner: %s)", name, owner_cluster_role)
