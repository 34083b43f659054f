"""Auto end to end on a fleet in mid-migration: one deployment whose pods land on H100, A100
and L4 nodes gets a threshold per GPU SKU, each where that SKU's crossover lies, and each pod
runs its own SKU's. The operator (its own ServiceAccount, the chart's RBAC) reads the real
Prometheus and the real engines behind the pods; traffic is bounded (clients, requests and
time) and goes to loopback pod IPs only. The rest of the autotuner's life on a cluster (the
first calibration, replica and SKU changes, failures) is test_autotune_lifecycle.py's."""

from __future__ import annotations

import pytest
from kubernetes import client

from spectune.engine.crossover import Crossover, bucket_distance
from spectune.operator.autotune import EXTENDED_WINDOWS
from spectune.operator.handlers import RESYNC_SECONDS
from tests.cluster.support import Cluster
from tests.support.waiting import wait_until

from .e2e import (
    Load,
    analytic_for,
    calibration_started,
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
    cluster: Cluster, admin: client.ApiClient, tuner: str
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
    with (
        Load([a100_url], stepping, seconds=longest + 60, temperature=1.0) as busy,
        Load(others, 6, seconds=longest + 60, temperature=1.0) as light,
    ):
        wait_until(
            "Calibrated=True",
            lambda: (
                sd_condition(admin, namespace, name, "Calibrated").get("status") == "True" or None
            ),
            timeout=longest,
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
