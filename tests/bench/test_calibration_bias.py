"""benchmarks/calibration_bias.py: its closed loop holds the running batch at the number of
clients, so a bucket's modes compare the same batches, steady and mixed alike."""

from __future__ import annotations

import argparse

import pytest

from spectune.engine.gate import GateSettings
from tests.cluster.support import load_script

bench = load_script("calibration_bias", "benchmarks")


def args(**kw: object) -> argparse.Namespace:
    base = {
        "sku": "L4", "acceptance": 0.6, "spread": 0.1, "prompt": [600, 1600],
        "output": [100, 300], "k": 4, "kv_gib": 40, "requests": 120,
    }  # fmt: skip
    return argparse.Namespace(**(base | kw))


@pytest.mark.parametrize("clients", [4, 8])
def test_every_decode_step_runs_at_the_batch_of_the_clients(clients) -> None:
    plain = bench.closed_loop(args(), clients, GateSettings(threshold=0))
    mixed = bench.closed_loop(args(), clients, GateSettings(threshold=None, exploration=0.5))
    steady = bench.closed_loop(args(), clients, GateSettings(threshold=None))
    assert set(plain) == {"plain"} and set(steady) == {"spec"} and set(mixed) == {"plain", "spec"}
    for bucket in (plain["plain"], mixed["plain"]):  # a plain step commits a token a sequence
        assert bucket.tokens / bucket.steps == pytest.approx(clients, rel=0.01)
    for run in (mixed, steady):  # a spec step commits one to five a sequence
        spec = run["spec"]
        assert clients < spec.tokens / spec.steps < 5 * clients
