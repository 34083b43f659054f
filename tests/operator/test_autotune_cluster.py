"""Auto end to end on a fleet in mid-migration: one deployment whose pods land on H100, A100
and L4 nodes gets a threshold per GPU SKU, each where that SKU's crossover lies, and each pod
runs its own SKU's. The operator (its own ServiceAccount, the chart's RBAC) reads the real
Prometheus and the real engines behind the pods; traffic is bounded (clients, requests and
time) and goes to loopback pod IPs only. The rest of the autotuner's life on a cluster (the
first calibration, replica and SKU changes, failures) is test_autotune_lifecycle.py's."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from spectune.engine.crossover import Crossover, bucket_distance
from spectune.operator.autotune import EXTENDED_WINDOWS
from spectune.operator.handlers import RESYNC_SECONDS
from spectune.operator.models import GROUP, PLURAL, VERSION
from tests.cluster.support import Cluster
from tests.support.waiting import wait_until

from .e2e import (
    Load,
    analytic_for,
    calibration_started,
    events,
    finished_after,
    simulated,
    speculation,
    stepped,
    urls,
)
from .support import (
    A100,
    AUTO,
    H100,
    L4,
    START,
    all_ready,
    create,
    get_sd,
    patch_sd,
    sd_condition,
    specdeployment,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
# One engine per node (spec.engine.template's affinity, as a fleet spreading its pods would).
ONE_PER_NODE = {
    "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "spectune-engine"}},
                "topologyKey": "kubernetes.io/hostname",
            }
        ]
    }
}


def test_each_sku_gets_its_measured_crossover_and_its_pods_run_its_threshold(
    cluster: Cluster, admin: client.ApiClient, tuner: str, request: pytest.FixtureRequest
) -> None:
    """No nodeSelector and one engine per node: four replicas fill the four GPU nodes, two
    H100, an A100 and an L4, as a fleet in mid-migration would. Curves are grouped by the engines'
    `device`. The A100 pod gets traffic whose batch crosses its crossover: n-gram lookup with
    k=16 under sampled traffic (few drafted tokens accepted) crosses where this machine's load
    reaches, and the measured crossover is within one batch bucket of the device model's for
    what the engine ran (tokens drafted and committed per spec step, from its own counters).
    The others get light traffic: speculation pays at every batch it makes, so their threshold
    stops it just past those batches (or stays a bucket below, the dead band), and each pod runs
    its own SKU's threshold. A later calibration that sees only the A100 keeps the other SKUs'
    thresholds on their pods.
    The pods' clocks run 4x slower than the SKU (the runner's default is 16): the modelled
    step times are the same, and each bucket gets its samples sooner."""
    namespace, name = tuner, "mixed"
    body = specdeployment(name, AUTO)
    spec = body["spec"]
    spec["replicas"] = 4
    spec["engine"] |= {
        "gpus": 1,
        "nodeSelector": {},
        "podAnnotations": {"spectune.io/simulate-gpu": "true",
                           "spectune.io/simulate-time-scale": "4"},
        "maxBatchSize": 96,
        "template": {"spec": {"affinity": ONE_PER_NODE}},
    }  # fmt: skip
    spec["speculation"] |= {"numSpeculativeTokens": 16}
    spec["speculation"]["threshold"]["max"] = 96
    spec["tuning"]["calibrationWindowSeconds"] = 120
    create(admin, namespace, body)
    # its four engines leave the CPU (and the nodes) to the next test, even when this one fails
    request.addfinalizer(
        lambda: client.CustomObjectsApi(admin).delete_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name
        )
    )
    pods = wait_until("4 ready engines", lambda: all_ready(admin, namespace, name, 4), 150)
    nodes = client.CoreV1Api(admin).list_node().items
    product = {n.metadata.name: n.metadata.labels["nvidia.com/gpu.product"] for n in nodes}
    sku_of = {url: product[p.spec.node_name] for url, p in zip(urls(pods), pods, strict=True)}
    assert sorted(sku_of.values()) == sorted([A100, H100, H100, L4]), sku_of
    (a100_url,) = [u for u, s in sku_of.items() if s == A100]
    others = [u for u in sku_of if u != a100_url]
    # batches in buckets 16, 24, 32 and 48, 10 s at each, round and round: each bucket gets
    # its samples in both modes within the window even on a busy machine
    stepping = stepped((16, 28, 44, 64), 10)
    # a calibration too noisy to decide explores for up to EXTENDED_WINDOWS windows
    longest = 60 + EXTENDED_WINDOWS * spec["tuning"]["calibrationWindowSeconds"] + 90
    # up to three calibrations: the first, the floor's (below), and one more where the machine
    # is busier than its lanes usually make it (CI once ran out of time after two)
    with (
        Load([a100_url], stepping, seconds=3 * longest + 60, temperature=1.0) as busy,
        Load(others, 6, seconds=3 * longest + 60, temperature=1.0) as light,
    ):
        # a first calibration may measure the A100 only from 24 up on a busy machine (bucket 16
        # short of samples): "does not pay from 24" agrees with the start value 1, which
        # stands; the floor trigger then measures below 24, where this load runs a quarter of
        # its steps, and the crossing is found (issue 59, O: the test asserted after the first)
        wait_until(
            "the A100's crossover measured",
            lambda: (
                sd_condition(admin, namespace, name, "Calibrated").get("status") == "True"
                and a100_crossing(admin, namespace, name)
            ),
            timeout=3 * longest,
        )
        truth = analytic_for(a100_url, "A100", k=16)
        assert simulated(cluster, namespace)
        status = get_sd(admin, namespace, name)["status"]
        per_sku = {s["sku"]: s for s in status["perSku"]}
        print(f"\nper SKU: {per_sku}; A100 model: {truth:.1f}")
        assert {s: e["pods"] for s, e in per_sku.items()} == {A100: 1, H100: 2, L4: 1}
        assert per_sku[A100].get("batchSize") is not None, per_sku[A100]
        measured = Crossover("crosses", per_sku[A100]["batchSize"])
        assert bucket_distance(measured, Crossover("crosses", truth)) <= 1, (per_sku[A100], truth)
        assert per_sku[A100]["threshold"] > START
        # six light clients over three pods make batches of at most 6: a light SKU's threshold
        # stays within them (a bound stops at 8, the bucket past 6; a crossover measured among
        # them, where speedup sits near 1, is lower), never the maximum an unbounded "pays at every
        # batch" would ask for
        for sku in (H100, L4):
            assert per_sku[sku]["threshold"] <= 8 < per_sku[A100]["threshold"], per_sku
        # every engine runs its SKU's threshold (a push that timed out on a busy engine is
        # retried at the next resync)
        want = {url: per_sku[sku]["threshold"] for url, sku in sku_of.items()}

        def in_step() -> bool:
            running = {url: speculation(url)["threshold"] for url in want}
            assert running == want, f"engines run {running}, want {want}"  # the timeout says
            return True

        wait_until("each engine on its SKU's threshold", in_step, 2 * RESYNC_SECONDS, 1)
        # the ConfigMap (a restarted pod's start) carries the SKU most pods run on
        assert status["threshold"]["current"] == per_sku[H100]["threshold"]
    for load in (busy, light):
        assert load.sent > 0 and load.failed < load.sent / 10, (load.sent, load.failed)

    # then a calibration that sees only the A100 (the only pod with traffic; a maximum age of a
    # minute starts it): the H100 and L4 thresholds measured before stand, and their pods keep
    # running them
    first = status["calibration"]["startedAt"]
    patch_sd(admin, namespace, name, {"tuning": {"maxAgeSeconds": 60}})
    with Load([a100_url], stepping, seconds=longest + 60, temperature=1.0) as again:
        try:
            wait_until(
                "a calibration of the A100 alone",
                lambda: finished_after(admin, namespace, name, first),
                timeout=longest,
            )
        except AssertionError as e:
            calibration = get_sd(admin, namespace, name)["status"]["calibration"]
            raise AssertionError(f"{e}; status.calibration: {calibration}") from e
        status = get_sd(admin, namespace, name)["status"]
        after = {s["sku"]: s for s in status["perSku"]}
        assert {s: after[s]["threshold"] for s in (H100, L4)} == {
            s: per_sku[s]["threshold"] for s in (H100, L4)
        }, (per_sku, after)
        assert calibration_started(admin, namespace, name, "maximum age")
        want = {url: after[sku]["threshold"] for url, sku in sku_of.items()}
        wait_until("each engine still on its SKU's threshold", in_step, 2 * RESYNC_SECONDS, 1)
    assert again.sent > 0 and again.failed < again.sent / 10, (again.sent, again.failed)


def a100_crossing(admin: client.ApiClient, namespace: str, name: str) -> bool:
    status = get_sd(admin, namespace, name).get("status") or {}
    return any(s["sku"] == A100 and s.get("batchSize") for s in status.get("perSku") or [])


def per_sku(admin: client.ApiClient, namespace: str, name: str) -> dict[str, int | None]:
    status = get_sd(admin, namespace, name).get("status") or {}
    return {s["sku"]: s.get("threshold") for s in status.get("perSku") or []}


def idle(admin: client.ApiClient, namespace: str, name: str) -> bool:
    status = get_sd(admin, namespace, name).get("status") or {}
    return (status.get("calibration") or {}).get("phase") == "Idle"


# Three engines of one deployment, one a node, on the two H100 nodes and the L4 node.
H100_AND_L4 = {
    "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "coming-back"}},
                "topologyKey": "kubernetes.io/hostname",
            }
        ]
    },
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [
                    {"key": "nvidia.com/gpu.product", "operator": "In", "values": [H100, L4]}
                ]}
            ]
        }
    }
}  # fmt: skip


def test_a_sku_whose_only_pod_leaves_and_comes_back_starts_no_calibration(
    cluster: Cluster, admin: client.ApiClient, tuner: str
) -> None:
    """Issue 59, E: an HPA scaling a mixed fleet's only L4 pod away, then back, fired the SKU
    trigger both times, re-exploring every batch, though both SKUs' thresholds stood in status.
    Two H100 pods and an L4 pod, measured; the L4 pod goes (its deletion cost the lowest) and
    comes back: no calibration starts, and both thresholds stand."""
    namespace, name = tuner, "coming-back"
    body = specdeployment(name, AUTO)
    body["spec"]["replicas"] = 3
    body["spec"]["engine"] |= {
        "nodeSelector": {},
        "template": {"spec": {"affinity": H100_AND_L4}},
        # clocks 4x slower than the SKU (the runner's default is 16): the L4 engine, the
        # slowest, then makes each bucket's samples within a window
        "podAnnotations": {"spectune.io/simulate-gpu": "true",
                           "spectune.io/simulate-time-scale": "4"},
    }  # fmt: skip
    body["spec"]["tuning"]["calibrationWindowSeconds"] = 60
    create(admin, namespace, body)
    core = client.CoreV1Api(admin)
    pods = wait_until("3 ready engines", lambda: all_ready(admin, namespace, name, 3), 150)
    nodes = {n.metadata.name: n.metadata.labels["nvidia.com/gpu.product"]
             for n in core.list_node().items}  # fmt: skip
    (l4,) = [p for p in pods if nodes[p.spec.node_name] == L4]
    with Load(urls(pods), 3, seconds=900, temperature=1.0) as load:
        try:
            wait_until(
                "both SKUs measured",
                lambda: (
                    set(per_sku(admin, namespace, name)) == {H100, L4}
                    and idle(admin, namespace, name)
                ),
                timeout=300,
            )
        except AssertionError as e:
            said = [f"{e.reason}: {e.message}" for e in events(admin, namespace, name)]
            raise AssertionError(f"{e}; status {get_sd(admin, namespace, name)}; {said}") from e
        measured = per_sku(admin, namespace, name)
        cost = {"controller.kubernetes.io/pod-deletion-cost": "-100"}
        core.patch_namespaced_pod(l4.metadata.name, namespace, {"metadata": {"annotations": cost}})
        since = time.time()
        patch_sd(admin, namespace, name, {"replicas": 2})

        def on_h100_only() -> list | None:
            ready = all_ready(admin, namespace, name, 2)
            return ready if ready and all(nodes[p.spec.node_name] == H100 for p in ready) else None

        load.retarget(urls(wait_until("the L4 pod gone", on_h100_only, 120)))
        time.sleep(30)  # three resyncs without it
        patch_sd(admin, namespace, name, {"replicas": 3})
        back = wait_until(
            "3 ready engines again", lambda: all_ready(admin, namespace, name, 3), 150
        )
        assert sorted(nodes[p.spec.node_name] for p in back) == [H100, H100, L4]
        load.retarget(urls(back))
        time.sleep(40)  # four resyncs with the L4 pod back and scraped
        started = [
            e.message
            for e in events(admin, namespace, name)
            if e.reason == "CalibrationStarted"
            and e.metadata.creation_timestamp.timestamp() >= since - 1
        ]
        assert started == [], started
        assert per_sku(admin, namespace, name) == measured
    assert load.sent > 0 and load.failed < load.sent / 10, (load.sent, load.failed)
