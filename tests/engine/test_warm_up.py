"""Ready means warm: after LLMEngine.warm_up, serving builds no fixed shape (a CUDA graph
each on CUDA; run eagerly here, where the warm-up builds them only when asked) and compiles
nothing, whatever the batch, the mode, the sampling or the draft length; and the warm-up, which
runs every shape on pad rows, changes no output."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from spectune.engine.config import EngineConfig
from spectune.engine.drafting import ModelDrafter
from spectune.engine.engine import LLMEngine
from spectune.engine.gate import GateSettings, SpeculationGate
from spectune.engine.sequence import SamplingParams

from .prompts import PROMPTS

MAX_BATCH = 6


def max_tokens(i: int) -> int:
    return 5 + (7 * i) % 30


def engine_for(tiny_pair: tuple[Path, Path], **kw: object) -> LLMEngine:
    target, draft = tiny_pair
    settings = {"max_batch_size": MAX_BATCH, "k": 3} | kw
    config = EngineConfig(model=str(target), draft=str(draft), device="cpu", **settings)
    return LLMEngine(config)


def shapes(engine: LLMEngine) -> set[tuple]:
    assert isinstance(engine.drafter, ModelDrafter)
    return {("target", *k) for k in engine.runner.shapes} | {
        ("draft", *k) for k in engine.drafter.runner.shapes
    }


def serve_a_mix(engine: LLMEngine) -> dict[int, list[int]]:
    """Requests arriving over time, greedy and sampled, of many lengths (each ends drafting
    fewer than k), at batches 1 to MAX_BATCH; the gate speculates below 3 and runs plain from
    3, so the draft catches up after plain runs. Returns the greedy requests' tokens."""
    engine.gate = SpeculationGate(GateSettings(threshold=3, hysteresis=0), random.Random(0))
    pending = list(enumerate(PROMPTS[:12]))
    greedy = {}
    step = 0
    while pending or engine.has_work():
        if pending and step % 5 == 0:
            i, prompt = pending.pop(0)
            params = SamplingParams(
                max_tokens=max_tokens(i), temperature=0.0 if i % 3 else 0.8, seed=i
            )
            seq = engine.add_request(prompt, params)
            if not params.temperature:
                greedy[i] = seq
        engine.step()
        step += 1
    return {i: s.output_ids for i, s in greedy.items()}


def test_after_the_warm_up_serving_builds_no_fixed_shape_and_changes_no_output(
    tiny_pair,
) -> None:
    engine = engine_for(tiny_pair)
    assert isinstance(engine.drafter, ModelDrafter)
    for runner in (engine.runner, engine.drafter.runner):
        runner.static_shapes = True  # what CUDA graphs and in-place Flex serve with
    built = engine.warm_up(fixed_shapes=True)  # by default, only where they are CUDA graphs
    warm = shapes(engine)
    assert built == len(warm) == engine.fixed_shapes
    assert {key[2] for key in warm} == {1, 2, 4, 8}  # every bucket up to MAX_BATCH's
    outputs = serve_a_mix(engine)
    assert shapes(engine) == warm, "a request built a shape the warm-up missed"
    reference = engine_for(tiny_pair, max_batch_size=1)
    reference.gate = SpeculationGate(GateSettings(threshold=0), random.Random(0))  # plain
    for i, tokens in outputs.items():
        params = SamplingParams(max_tokens=max_tokens(i))
        assert tokens == reference.generate([PROMPTS[i]], params)[0].token_ids


@pytest.mark.slow  # Inductor builds C++ kernels on the CPU: some 30 s on 2 cores, cold
def test_after_the_warm_up_serving_compiles_nothing(tiny_pair) -> None:
    """The compiled small ops (--compile) are specialised by torch.compile for sizes 1 and
    above: the warm-up runs both, plain and speculating, so no request compiles."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    engine = engine_for(tiny_pair, compile=True)
    engine.warm_up()
    compiled = counters["stats"]["unique_graphs"]
    assert compiled > 0
    serve_a_mix(engine)
    assert counters["stats"]["unique_graphs"] == compiled, "a request waited for a compile"
