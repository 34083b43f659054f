"""Rollouts on a full GPU pool, against the real API server, scheduler and pod runner: a node
whose every GPU an engine holds, and a new engine image. Kubernetes' default rollout (25% surge)
asks for a pod more than replicas, which waits for a GPU for ever, and the rollout with it; the
operator's default for GPU engines replaces one pod at a time."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client

from tests.support.waiting import wait_until

from .support import all_ready, create, patch_sd, specdeployment

pytestmark = pytest.mark.cluster
GPUS = 2
TAINT = "spectune.io/test-pool"


@pytest.fixture
def full_pool(admin: client.ApiClient) -> Iterator[str]:
    """A fake node of GPUS GPUs that only this test's pods tolerate; its pool label's value.
    Its pods take loopback IPs from its podCIDR, as the cluster's nodes' do."""
    pool = f"pool-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(admin)
    resources = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(GPUS)}
    core.create_node(
        {
            "metadata": {
                "name": pool,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {"kubernetes.io/hostname": pool, "type": "kwok", TAINT: pool},
            },
            "spec": {
                "podCIDR": "127.0.90.0/24",
                "podCIDRs": ["127.0.90.0/24"],
                "taints": [{"key": TAINT, "value": pool, "effect": "NoSchedule"}],
            },
            "status": {
                "addresses": [{"type": "InternalIP", "address": "127.0.0.90"}],
                "capacity": resources,
                "allocatable": resources,
            },
        }
    )
    yield pool
    core.delete_node(pool)


def test_a_new_engine_image_rolls_out_on_a_full_gpu_pool(
    admin, operator, namespace, full_pool
) -> None:
    template = {
        "spec": {"tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]}
    }
    engine = {"gpus": 1, "nodeSelector": {TAINT: full_pool}, "template": template}
    create(admin, namespace, specdeployment("full", replicas=GPUS, engine=engine))
    wait_until("both engines ready", lambda: all_ready(admin, namespace, "full", GPUS), timeout=180)
    apps = client.AppsV1Api(admin)
    deployment = apps.read_namespaced_deployment("full", namespace)
    assert deployment.spec.strategy.rolling_update.max_surge == 0

    patch_sd(admin, namespace, "full", {"engine": {**engine, "image": "spectune/engine:next"}})

    def rolled() -> bool:
        d = apps.read_namespaced_deployment("full", namespace)
        s = d.status
        return (
            d.spec.template.spec.containers[0].image == "spectune/engine:next"
            and s.observed_generation == d.metadata.generation
            and s.updated_replicas == s.replicas == s.ready_replicas == GPUS
        )

    wait_until("the rollout to complete on the full pool", rolled, timeout=300)
    pods = wait_until("the new pods ready", lambda: all_ready(admin, namespace, "full", GPUS))
    images = {p.spec.containers[0].image for p in pods}
    assert images == {"spectune/engine:next"}
