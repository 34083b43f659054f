"""The fleet simulator's engine pod (sim/engine_pod.py) against the real engine on a simulated
SKU: the same requests, all queued at once, run to completion on both, and each (mode, batch
bucket) with enough steps in both costs the same mean modelled step time.

The real engine runs the tiny target and draft (greedy) and charges every forward to the L4's
modelled clock for the virtual Llama 8B / 1B; SimEngine charges its forwards for the same
models. Plain steps are the same forwards over the same batches, so they match to rounding;
spec steps match closely, not exactly: the simulator accepts drafted tokens iid at each
request's rate (here the per-token rate that gives the request's measured accepted/drafted),
so its sequences grow and pause at other iterations than the real ones. Replaying the real
run's acceptance draw for draw removes that difference, and then every step must match.
benchmarks/sim_fidelity.py prints the whole comparison at a larger size.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from spectune.engine import contract as c
from spectune.engine.config import EngineConfig
from spectune.engine.device_time import sku_named
from spectune.engine.engine import LLMEngine
from spectune.engine.gate import GateSettings
from spectune.engine.sequence import SamplingParams, Sequence
from spectune.engine.zoo.training import corpus, held_out_prompts
from spectune.sim.engine_pod import PodConfig, Request, SimEngine
from tests.cluster.support import load_script

SKU = "L4"
K = 4
MIN_STEPS = 20  # a bucket is compared when both runs have at least this many steps in it
Key = tuple[str, int]  # (mode, batch bucket)
Tallies = dict[Key, list[float]]  # -> [steps, seconds]
Job = tuple[list[int], int]  # (prompt tokens, output tokens)


@cache
def held_out() -> list[bytes]:
    return corpus()[1]


def workload(count: int, seed: int = 0) -> list[Job]:
    """Held-out byte prompts of 16-96 tokens and outputs of 48-100, the lengths the tiny
    models were trained on."""
    texts = held_out_prompts(held_out(), count, 96)
    rng = random.Random(seed)
    return [(t[: rng.randint(16, 96)], rng.randint(48, 100)) for t in texts]


def draft_len(engine: LLMEngine, s: Sequence) -> int:
    """LLMEngine._draft_len's answer for this iteration, without using up a pause."""
    if s.paused_iterations > 0:
        return 0
    return max(0, min(engine.k, s.remaining - 1, engine.max_model_len - len(s) - 1))


@dataclass
class Real:
    engine: LLMEngine
    tallies: Tallies
    ratios: list[float]  # each request's accepted / drafted
    # What SimEngine's acceptance RNG must draw to accept exactly what the engine accepted, in
    # its order: per drafted token 0.0 while accepted, then 1.0 for the first rejected one.
    draws: list[float]


class Replay:
    """SimEngine's acceptance RNG replaying a real run's draws (rates all 0.5)."""

    def __init__(self, draws: list[float]) -> None:
        self._draws = iter(draws)

    def random(self) -> float:
        return next(self._draws)


def run_real(
    pair: tuple[Path, Path], jobs: list[Job], gate: GateSettings, batch: int, floor: float
) -> Real:
    """The real engine's decode steps per (mode, bucket), each request's accepted/drafted,
    and the draws that replay its acceptance."""
    target, draft = pair
    config = EngineConfig(
        model=str(target), draft=str(draft), k=K, gate=gate, device="cpu", max_batch_size=batch,
        kv_cache_bytes=16 << 20, simulate_device=SKU, min_acceptance=floor,
    )  # fmt: skip
    engine = LLMEngine(config)
    assert engine.simulation is not None
    engine.simulation.hold = False
    seqs = [engine.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True)) for p, n in jobs]
    drafted: dict[int, int] = defaultdict(int)
    accepted: dict[int, int] = defaultdict(int)
    tallies: Tallies = defaultdict(lambda: [0, 0.0])
    draws: list[float] = []
    while engine.has_work():
        plan = {s.seq_id: draft_len(engine, s) for s in engine.scheduler.running}
        before = len(engine.iterations)
        updates = engine.step()
        if len(engine.iterations) == before:
            continue
        it = engine.iterations[-1]
        if it.mode == "prefill":
            continue
        tally = tallies[(it.mode, c.batch_bucket(it.batch_size))]
        tally[0] += 1
        tally[1] += it.seconds
        for u in updates if it.mode == "spec" else ():
            n, acc = plan[u.seq.seq_id], len(u.new_tokens) - 1
            drafted[u.seq.seq_id] += n
            accepted[u.seq.seq_id] += acc
            draws += [0.0] * acc + ([1.0] if acc < n else [])
    assert engine.scheduler.num_preemptions == 0
    ratios = [accepted[s.seq_id] / drafted[s.seq_id] if drafted[s.seq_id] else 0.0 for s in seqs]
    return Real(engine, tallies, ratios, draws)


def per_token_rate(ratio: float) -> float:
    """p such that iid acceptance (stopping at the first rejection) accepts `ratio` of K
    drafted tokens on average: (p + p^2 + ... + p^K) / K = ratio."""
    lo, hi = 0.0, 1.0
    for _ in range(50):
        p = (lo + hi) / 2
        lo, hi = (p, hi) if sum(p**i for i in range(1, K + 1)) / K < ratio else (lo, p)
    return (lo + hi) / 2


def run_sim(
    real: Real, jobs: list[Job], gate: GateSettings, replay: bool = False
) -> tuple[Tallies, float]:
    """SimEngine with the real engine's settings and the same requests: its step series and
    its modelled clock at the end. `replay`: it accepts exactly what the real run did, draw
    for draw."""
    engine = real.engine
    cfg = engine.config
    pod = PodConfig(
        sku=sku_named(SKU), method="draft", k=K, max_batch_size=cfg.max_batch_size,
        kv_cache_bytes=64 << 30, max_model_len=engine.max_model_len, max_queue=len(jobs),
        ttft_s=1e9, tpot_s=1e9, block_size=cfg.block_size,
        max_prefill_tokens=cfg.max_prefill_tokens, min_acceptance=cfg.min_acceptance,
        pause_iterations=cfg.pause_iterations,
    )  # fmt: skip
    sim = SimEngine("fidelity", pod, gate, seed=cfg.seed)  # the engine's exploration draws
    rates = [0.5] * len(jobs) if replay else [per_token_rate(r) for r in real.ratios]
    if replay:
        sim.acceptance_draws = Replay(real.draws)  # type: ignore[assignment]
    for i, ((prompt, output), rate) in enumerate(zip(jobs, rates, strict=True)):
        assert sim.submit(Request(i, 0.0, len(prompt), output, rate), 0.0)
    now = 0.0
    while sim.has_work() and (seconds := sim.step(now)) is not None:
        now += seconds
    assert sim.scheduler.num_preemptions == 0
    values = sim.series.values
    tallies = {
        (dict(labels)["mode"], int(dict(labels)["batch"])): [
            round(count),
            values[(f"{c.STEP_SECONDS}_sum", labels)],
        ]
        for (metric, labels), count in values.items()
        if metric == f"{c.STEP_SECONDS}_count"
    }
    return tallies, now


def compared(real: Tallies, sim: Tallies) -> dict[Key, tuple[float, float]]:
    """(real, simulated) mean step seconds of each (mode, bucket) both ran often enough."""
    return {
        key: (real[key][1] / real[key][0], sim[key][1] / sim[key][0])
        for key in sorted(set(real) & set(sim))
        if min(real[key][0], sim[key][0]) >= MIN_STEPS
    }


def test_plain_steps_cost_what_the_engine_charges(tiny_pair) -> None:
    gate = GateSettings(threshold=0)
    jobs = workload(8)
    run = run_real(tiny_pair, jobs, gate, batch=4, floor=0.2)
    real, (sim, _) = run.tallies, run_sim(run, jobs, gate)
    assert {mode for mode, _ in real} == {mode for mode, _ in sim} == {"plain"}
    # the same forwards over the same batches: the same steps, bucket by bucket
    assert {k: v[0] for k, v in sim.items()} == {k: v[0] for k, v in real.items()}
    means = compared(real, sim)
    assert ("plain", 4) in means, real
    for key, (real_s, sim_s) in means.items():
        assert sim_s == pytest.approx(real_s, rel=0.01), key


@pytest.mark.parametrize(
    ("requests", "batch", "floor", "tail"),
    [
        # Pausing off: every step drafts (all but a request's last tokens), so each bucket,
        # the tail's too, costs what the forwards cost.
        (8, 4, 0.0, True),
        (3, 1, 0.0, True),
        # Every drafting step pauses its sequence (its acceptance estimate stays below 1):
        # sequences admitted together spend most steps all paused, with no draft forward.
        (8, 4, 1.0, True),
        # The engine's pausing: in the tail, whether the few sequences left are all paused
        # decides a step's cost (67 or 108 ms on the L4), and iid acceptance pauses less
        # often than real text's runs of rejections (up to 18% apart at batch 1): only the
        # full batch is compared.
        (8, 4, 0.2, False),
    ],
    ids=["unpaused", "unpaused-alone", "all-paused", "pausing-full-batch"],
)
def test_spec_steps_cost_what_the_engine_charges(tiny_pair, requests, batch, floor, tail) -> None:
    gate = GateSettings(threshold=None)
    jobs = workload(requests)
    run = run_real(tiny_pair, jobs, gate, batch, floor)
    real, (sim, _) = run.tallies, run_sim(run, jobs, gate)
    assert {mode for mode, _ in real} == {mode for mode, _ in sim} == {"spec"}
    means = compared(real, sim)
    assert ("spec", batch) in means, (real, sim)
    off = {
        key: f"real {real_s * 1e3:.2f} ms, sim {sim_s * 1e3:.2f} ms"
        for key, (real_s, sim_s) in means.items()
        if (tail or key == ("spec", batch)) and sim_s != pytest.approx(real_s, rel=0.05)
    }
    assert not off


@pytest.mark.parametrize(
    ("floor", "exploration"),
    [(0.2, 0.2), (1.0, 0.0)],
    ids=["pausing-exploring", "all-paused"],
)
def test_replayed_acceptance_costs_every_step_the_same(tiny_pair, floor, exploration) -> None:
    """Accepting exactly what the real engine accepted, the simulator runs the same batches
    through the same lengths, pauses, draft catch-ups and explored plain steps (the gate's
    draws come from the same seed), so every bucket's steps cost exactly the same."""
    gate = GateSettings(threshold=None, exploration=exploration)
    jobs = workload(8)
    run = run_real(tiny_pair, jobs, gate, batch=4, floor=floor)
    sim, clock = run_sim(run, jobs, gate, replay=True)
    assert {k: v[0] for k, v in sim.items()} == {k: v[0] for k, v in run.tallies.items()}
    off = {
        key: f"{n} steps: real {real_s / n * 1e3:.3f} ms, sim {sim[key][1] / n * 1e3:.3f} ms"
        for key, (n, real_s) in run.tallies.items()
        if sim[key][1] != pytest.approx(real_s, rel=1e-9)
    }
    assert not off
    assert run.engine.simulation is not None  # prefills too: the same clock at the end
    assert clock == pytest.approx(run.engine.simulation.modelled, rel=1e-9)


# (threshold, TPOT SLO): the SLO near the real run's median TPOT, so that goodput tells
# requests apart
@pytest.mark.parametrize(
    ("threshold", "tpot_s"), [(None, 0.033), (0, 0.077)], ids=["speculating", "plain"]
)
def test_closed_loop_clients_see_the_same_batches_and_goodput(tiny_pair, threshold, tpot_s) -> None:
    """Under the same closed-loop load (192 requests from 16 clients pausing 2 s on average
    between requests, on the L4's modelled clock) the simulator's mean running batch and
    goodput are within 10% of the real engine's (the issue's bound) and at most 10% of its
    decode steps would have to move batch bucket for the distributions to match, acceptance
    drawn iid at each request's measured rate; replaying the real acceptance, they are the
    same."""
    bench = load_script("sim_fidelity", "benchmarks")
    jobs = bench.workload(192, 0, (16, 96), (32, 96), think_s=2.0)
    gate = GateSettings(threshold=threshold)
    real, engine = bench.run_real(jobs, gate, SKU, K, 32, clients=16)
    rates = bench.acceptances(real, K, "matched", pooled=False)
    sim = bench.run_sim(jobs, rates, gate, engine, clients=16)
    slo = 1.0, tpot_s
    found = bench.closed_loop(real, sim, *slo)
    assert len(jobs) / 4 < found.met[0] < len(jobs) * 3 / 4, found
    assert found.batch[1] == pytest.approx(found.batch[0], rel=0.1), found
    assert found.distance <= 0.1, found
    assert found.goodput[1] == pytest.approx(found.goodput[0], rel=0.1), found
    replayed = bench.run_sim(jobs, [0.5] * len(jobs), gate, engine, real.draws, clients=16)
    assert [b for _, b in replayed.batches] == [b for _, b in real.batches]
    assert replayed.last_sent == pytest.approx(real.last_sent, rel=1e-9)
    again = bench.closed_loop(real, replayed, *slo)
    assert again.met[1] == again.met[0] and again.distance == 0, again
