"""In simulated mode the pod runner starts each engine on its node's GPU SKU (as a GPU driver
makes the node's device visible): three engine pods on an H100, an A100 and an L4 node report
those SKUs as simulated, take the SKU's modelled time per step, and on this 2-core machine,
serving at once, their iterations kept to their modelled time at the e2e time scale (at most one
in ten overran: a CPU stall now and then, not a scale too fast for this machine).

A second pod runner, started here with --simulate-gpus and its own label selector, runs
these pods; the cluster's own runner (real CPU timing) ignores them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from spectune.engine import contract
from tests.cluster.support import REPO, Cluster
from tests.server.metrics_text import parse
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PORT = 8200
TIME_SCALE = 16  # the e2e scale: batch-1 steps take 96 ms on the H100, 206 A100, 1067 L4
SELECTOR = "spectune-test=simulated-gpus"
NODES = {  # product: (its nodes' name prefix, a batch-1 plain step's modelled seconds)
    "NVIDIA-H100-80GB-HBM3": ("gpu-h100-", 6.0e-3),
    "NVIDIA-A100-SXM4-40GB": ("gpu-a100-", 12.9e-3),
    "NVIDIA-L4": ("gpu-l4-", 66.7e-3),
}
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def engine_pod(product: str) -> dict[str, Any]:
    name = product.split("-")[1].lower()
    return {
        "metadata": {"name": f"engine-{name}", "labels": {"spectune-test": "simulated-gpus"}},
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.product": product},
            "containers": [{
                "name": "engine", "image": "ghcr.io/spectune/spectune-engine:dev",
                "args": ["--model", "tiny-target", "--method", "ngram", "--device", "cpu",
                         "--max-model-len", "256"],
                "ports": [{"name": "http", "containerPort": PORT}],
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
            }],
        },
    }  # fmt: skip


@pytest.fixture(scope="module")
def simulated(cluster: Cluster, tiny_pair: tuple[Path, Path], tmp_path_factory) -> Iterator[dict]:
    """{product: base URL} of three Ready engine pods on simulated GPUs."""
    tmp = tmp_path_factory.mktemp("simulated-runner")
    runner = subprocess.Popen(
        [sys.executable, str(REPO / "hack" / "pod_runner.py"), "--kubeconfig",
         str(cluster.kubeconfig), "--selector", SELECTOR, "--simulate-gpus",
         "--simulate-time-scale", str(TIME_SCALE), "--state-dir", str(tmp / "state"),
         "--log-dir", str(tmp / "logs")],
        stdout=(tmp / "runner.log").open("w"), stderr=subprocess.STDOUT,
        env=os.environ | {"SPECTUNE_CACHE": str(tiny_pair[0].parent)}, start_new_session=True,
    )  # fmt: skip
    ns = f"simgpu-{uuid.uuid4().hex[:8]}"
    with cluster.api() as api:
        core = client.CoreV1Api(api)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        try:
            for product in NODES:
                core.create_namespaced_pod(ns, engine_pod(product))

            def all_ready() -> dict[str, str] | None:
                pods = core.list_namespaced_pod(ns).items
                ready = [p for p in pods if is_ready(p)]
                if len(ready) < len(NODES):
                    return None
                return {p.spec.node_selector["nvidia.com/gpu.product"]: p for p in ready}

            pods = wait_until("three simulated engines to be Ready", all_ready, timeout=240)
            for product, pod in pods.items():
                assert pod.spec.node_name.startswith(NODES[product][0])
            yield {product: f"http://{pod.status.pod_ip}:{PORT}" for product, pod in pods.items()}
        finally:
            core.delete_namespace(ns)
            os.killpg(runner.pid, signal.SIGTERM)
            runner.wait(timeout=60)


def is_ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def complete(base: str, n: int) -> None:
    body = {"model": "tiny-target", "prompt": "def main():", "max_tokens": 16, "ignore_eos": True}
    for _ in range(n):
        request = urllib.request.Request(
            f"{base}/v1/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        with HTTP.open(request, timeout=120) as r:
            assert r.status == 200


def metrics(base: str) -> list[tuple[str, dict[str, str], float]]:
    with HTTP.open(f"{base}/metrics", timeout=10) as r:
        return [(name, dict(labels), v) for (name, labels), v in parse(r.read().decode()).items()]


def test_each_engine_runs_on_its_nodes_sku_keeping_its_clock(simulated: dict[str, str]) -> None:
    # Three clients per engine, all three engines at once: the load the e2e tests put on them.
    clients = [
        threading.Thread(target=complete, args=(base, 3))
        for base in simulated.values()
        for _ in range(3)
    ]
    for t in clients:
        t.start()
    for t in clients:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in clients)
    for product, base in simulated.items():
        samples = metrics(base)
        (info,) = [labels for name, labels, _ in samples if name == contract.ENGINE_INFO]
        assert info["device"] == product and info["simulated"] == "true", info
        (overruns,) = [v for name, _, v in samples if name == contract.SIMULATED_OVERRUNS]
        decode = sum(v for name, _, v in samples if name == contract.ITERATIONS)
        # a stall of this shared CPU now and then (2 of some 60 once), not a time scale too fast
        assert decode > 0 and overruns <= 0.1 * decode, (product, overruns, decode)
        steps = {
            labels["mode"]: v
            for name, labels, v in samples
            if name == contract.STEP_SECONDS + "_sum" and labels["batch"] in ("1", "2", "3")
        }
        counts = {
            labels["mode"]: v
            for name, labels, v in samples
            if name == contract.STEP_SECONDS + "_count" and labels["batch"] in ("1", "2", "3")
        }
        # A plain or spec step at batch 1-3 is memory-bound: the SKU's weight read, x scale.
        floor = TIME_SCALE * NODES[product][1]
        for mode, seconds in steps.items():
            mean = seconds / counts[mode]
            assert floor * 0.95 < mean < floor * 1.3, (product, mode, mean, floor)
