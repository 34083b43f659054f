"""The direct per-batch sweep: hold exactly n sequences in decode, run decode iterations
in spec and in plain mode, and time them, for each batch size n.

It drives the engine's own `step()` and switches the gate between modes, so what it
times is the code path serving runs. The modes alternate in short blocks so that a
machine whose speed drifts (other work, frequency changes) slows both alike. The first
iteration after a switch is not timed: a spec iteration after plain ones first lets
the draft catch up on the tokens it has not seen, a cost the gate pays once per switch,
not per step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from spectune.engine.bench.workload import BenchError
from spectune.engine.block_manager import blocks_for
from spectune.engine.crossover import aggregate_median, speedup_curve
from spectune.engine.engine import Iteration, LLMEngine
from spectune.engine.gate import GateSettings
from spectune.engine.sequence import SamplingParams, Sequence

MODES = {"spec": GateSettings(threshold=None), "plain": GateSettings(threshold=0)}


@dataclass(frozen=True)
class SweepSettings:
    batch_sizes: tuple[int, ...]
    iterations: int = 16  # timed decode iterations per mode and batch size (at least)
    block: int = 2  # iterations per mode before switching to the other
    stop_after: int = 2  # stop once speedup stayed below 1.0 for this many sizes; 0: never
    min_prompts: int = 8  # small batches rotate through this many prompts at least

    @property
    def rounds(self) -> int:
        return math.ceil(self.iterations / self.block)

    def groups(self, n: int) -> int:
        """Sets of n fresh sequences a batch size is measured on: acceptance depends on
        the text, so batch 1 must not rest on a single prompt."""
        return min(self.rounds, math.ceil(self.min_prompts / n))

    def rounds_per_group(self, n: int) -> int:
        return math.ceil(self.rounds / self.groups(n))

    def tokens_per_sequence(self, k: int, rounds: int) -> int:
        """An upper bound on what one sequence generates in `rounds` rounds."""
        spec_steps = rounds * (self.block + 1)
        return spec_steps * (k + 1) + spec_steps + 1


def measure_batch(
    engine: LLMEngine, prompts: list[list[int]], n: int, settings: SweepSettings
) -> list[Iteration]:
    """Timed decode iterations of both modes with exactly n sequences running."""
    rounds = settings.rounds_per_group(n)
    budget = settings.tokens_per_sequence(engine.k, rounds)
    _check_room(engine, prompts, n, budget)
    timed = []
    for g in range(settings.groups(n)):
        group = [prompts[(g * n + i) % len(prompts)] for i in range(n)]
        timed += _measure_group(engine, group, budget, rounds, settings.block)
    return timed


def _measure_group(
    engine: LLMEngine, prompts: list[list[int]], budget: int, rounds: int, block: int
) -> list[Iteration]:
    params = SamplingParams(max_tokens=budget, ignore_eos=True)
    seqs = [engine.add_request(p, params) for p in prompts]
    try:
        while engine.scheduler.waiting:
            engine.step()
        return [it for _ in range(rounds) for it in _round(engine, seqs, block)]
    finally:
        for seq in seqs:
            engine.abort(seq)


def _round(engine: LLMEngine, seqs: list[Sequence], block: int) -> list[Iteration]:
    timed = []
    for gate in MODES.values():
        engine.gate.settings = gate
        engine.step()  # the switch iteration, not timed
        for _ in range(block):
            engine.step()
            timed.append(engine.iterations[-1])
    if any(it.batch_size != len(seqs) for it in timed):
        raise BenchError("a sequence left the batch during the sweep (preempted?)")
    return timed


def _check_room(engine: LLMEngine, prompts: list[list[int]], n: int, budget: int) -> None:
    """Every sequence must stay resident: a preemption would time a different batch."""
    longest = max(len(p) for p in prompts)
    need = longest + budget + engine.k + 1
    if need >= engine.max_model_len:
        raise BenchError(
            f"the sweep needs {need} positions per sequence; the context holds "
            f"{engine.max_model_len}: use shorter prompts or fewer --iterations"
        )
    blocks = n * blocks_for(need, engine.config.block_size)
    if blocks > engine.scheduler.blocks.usable_blocks:
        raise BenchError(
            f"batch size {n} needs {blocks} KV blocks, the cache holds "
            f"{engine.scheduler.blocks.usable_blocks}: pass a larger --kv-cache-bytes"
        )


def sweep(
    engine: LLMEngine, prompts: list[list[int]], settings: SweepSettings
) -> Iterator[list[Iteration]]:
    """The timed iterations of each batch size in turn, smallest first; stops early once
    speculation has lost at `stop_after` sizes in a row."""
    measure_batch(engine, prompts, settings.batch_sizes[0], settings)  # warm-up, not kept
    losing = 0
    for n in settings.batch_sizes:
        timed = measure_batch(engine, prompts, n, settings)
        yield timed
        (point,) = speedup_curve(aggregate_median(timed))
        losing = losing + 1 if point.speedup < 1.0 else 0
        if settings.stop_after and losing >= settings.stop_after:
            return
