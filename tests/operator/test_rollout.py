"""Rollouts on a full GPU pool, against the real API server, scheduler and pod runner: a node
whose every GPU an engine holds, and a new engine image. Kubernetes' default rollout (25% surge)
asks for a pod more than replicas, which waits for a GPU for ever, and the rollout with it; the
operator's default for GPU engines replaces one pod at a time. Under streaming load, such a
rollout refuses and cuts nothing: a stopping engine keeps serving through its preStop sleep
while endpoints let it go, then finishes what it holds."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client

from tests.support.waiting import wait_until

from .streaming_load import Endpoints, StreamingLoad
from .support import all_ready, create, patch_sd, specdeployment

pytestmark = pytest.mark.cluster
GPUS = 2
TAINT = "spectune.io/test-pool"
TOLERATE = [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]
# Endpoint propagation: how long a pod that left the endpoints is still routed to (kube-proxy
# and ingresses take a second or a few); the default preStop sleep (10 s) outlasts it.
LAG_S = 2.0


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
    engine = {
        "gpus": 1,
        "nodeSelector": {TAINT: full_pool},
        "template": {"spec": {"tolerations": TOLERATE}},
    }
    create(admin, namespace, specdeployment("full", replicas=GPUS, engine=engine))
    wait_until("both engines ready", lambda: all_ready(admin, namespace, "full", GPUS), timeout=180)
    deployment = client.AppsV1Api(admin).read_namespaced_deployment("full", namespace)
    assert deployment.spec.strategy.rolling_update.max_surge == 0
    roll_to_a_new_image(admin, namespace, engine)


def roll_to_a_new_image(admin: client.ApiClient, namespace: str, engine: dict) -> None:
    """Give SpecDeployment `full` a new engine image; wait until every pod runs it, ready."""
    apps = client.AppsV1Api(admin)
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


@pytest.mark.slow
@pytest.mark.parametrize("pre_stop", [None, 0], ids=["default-prestop", "no-prestop"])
def test_a_rollout_under_streaming_load_refuses_and_cuts_nothing(
    admin, operator, namespace, full_pool, pre_stop: int | None
) -> None:
    """Issue 61, item 4: nothing waited for endpoint removal, so requests routed in that
    window were refused in every rollout. With the default preStop, every request of a rollout
    under streaming load (some sent to a pod that had already left the endpoints) ends well;
    without it (a template's preStop of 0 s, the old behaviour) some are refused or cut:
    the load tells the two apart."""
    pod: dict = {"tolerations": TOLERATE}
    if pre_stop is not None:
        pod["containers"] = [
            {"name": "engine", "lifecycle": {"preStop": {"sleep": {"seconds": pre_stop}}}}
        ]
    engine = {"gpus": 1, "nodeSelector": {TAINT: full_pool}, "template": {"spec": pod}}
    create(admin, namespace, specdeployment("full", replicas=GPUS, engine=engine))
    wait_until("both engines ready", lambda: all_ready(admin, namespace, "full", GPUS), timeout=180)
    endpoints = Endpoints(admin, namespace, "full", LAG_S)
    load = StreamingLoad(endpoints, "tiny-target", limit_s=420)
    try:
        wait_until("20 requests served", lambda: sum(o.result == "ok" for o in load.outcomes) >= 20)
        roll_to_a_new_image(admin, namespace, engine)
        time.sleep(LAG_S + 1)
    finally:
        counts = load.stop()
        endpoints.close()
    window = [o for o in load.outcomes if o.after_leaving]
    print(
        f"\npreStop {pre_stop}: {dict(counts)}; {len(window)} sent to a pod gone from the endpoints"
    )
    if pre_stop is None:
        assert set(counts) == {"ok"}, counts
        assert window, "no request was routed to a leaving pod: the window went untested"
    else:
        assert sum(n for result, n in counts.items() if result != "ok") > 0, counts
