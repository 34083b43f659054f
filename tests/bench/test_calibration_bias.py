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
    assert set(plain.buckets) == {"plain"} and set(steady.buckets) == {"spec"}
    assert set(mixed.buckets) == {"plain", "spec"}
    for bucket in (plain.buckets["plain"], mixed.buckets["plain"]):  # a token a sequence
        assert bucket.tokens / bucket.steps == pytest.approx(clients, rel=0.01)
    for run in (mixed, steady):  # a spec step commits one to five a sequence
        spec = run.buckets["spec"]
        assert clients < spec.tokens / spec.steps < 5 * clients


def test_each_request_has_its_tpot_and_speculation_spreads_them() -> None:
    """Every request past the loop's first tenth, sorted; plain decoding gives each about the
    step time, speculation each its own acceptance's share of it."""
    plain = bench.closed_loop(args(), 8, GateSettings(threshold=0))
    steady = bench.closed_loop(args(), 8, GateSettings(threshold=None))
    for run in (plain, steady):
        assert len(run.tpot) == 120 - 12 and run.tpot == sorted(run.tpot) and run.tpot[0] > 0

    def spread(run) -> float:
        return run.tpot_at(0.9) / run.tpot_at(0.1)

    assert spread(steady) > 1.2 * spread(plain)  # 1.45 against 1.09 here
