"""Greedy speculation is lossless: token for token the plain output, at batch sizes 1-16,
with mixed prompt lengths, with and without preemption, for both drafting methods, and
through the fixed shapes CUDA graphs capture (run eagerly here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spectune.engine.config import EngineConfig
from spectune.engine.drafting import ModelDrafter
from spectune.engine.engine import LLMEngine
from spectune.engine.sequence import SamplingParams

from .prompts import PROMPTS

PARAMS = SamplingParams(max_tokens=40, ignore_eos=True)


def run(
    target: Path, prompts: list[str], static_shapes: bool = False, **kw: object
) -> tuple[list[list[int]], LLMEngine]:
    engine = LLMEngine(EngineConfig(model=str(target), device="cpu", **kw))
    runners = [engine.runner]
    if isinstance(engine.drafter, ModelDrafter):
        runners.append(engine.drafter.runner)
    for runner in runners:
        runner.static_shapes = static_shapes
    return [c.token_ids for c in engine.generate(prompts, PARAMS)], engine


@pytest.fixture(scope="module")
def plain_reference(tiny_pair: tuple[Path, Path]) -> list[list[int]]:
    """Each prompt alone, no speculation: the ground truth."""
    target, _ = tiny_pair
    outputs, _ = run(target, PROMPTS, max_batch_size=1)
    return outputs


def test_plain_batching_matches_one_at_a_time(tiny_pair, plain_reference) -> None:
    outputs, _ = run(tiny_pair[0], PROMPTS, max_batch_size=16)
    assert outputs == plain_reference


@pytest.mark.parametrize("batch", [1, 4, 16])
@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_speculation_matches_plain(tiny_pair, plain_reference, method: str, batch: int) -> None:
    target, draft = tiny_pair
    extra = {"draft": str(draft)} if method == "draft" else {"method": "ngram"}
    outputs, engine = run(target, PROMPTS, max_batch_size=batch, **extra)
    assert outputs == plain_reference
    spec = [it for it in engine.iterations if it.mode == "spec"]
    assert spec and max(it.batch_size for it in spec) == min(batch, len(PROMPTS))
    assert sum(it.accepted for it in spec) > 0


@pytest.mark.parametrize("method", ["draft", "ngram", "none"])
def test_preemption_keeps_output_unchanged(tiny_pair, plain_reference, method: str) -> None:
    target, draft = tiny_pair
    extra = {"draft": str(draft)} if method == "draft" else {"method": method}
    # 3 MB holds ~45 blocks of 16 tokens of tiny-target KV: not 16 sequences of 50-200 tokens.
    outputs, engine = run(target, PROMPTS, max_batch_size=16, kv_cache_bytes=3_000_000, **extra)
    assert engine.scheduler.num_preemptions > 0
    assert outputs == plain_reference


@pytest.mark.parametrize(
    ("method", "attention"),
    [
        ("draft", "gather"),
        ("ngram", "gather"),
        ("none", "gather"),
        pytest.param("draft", "flex", marks=pytest.mark.slow),  # eager Flex: some 16 s
    ],
)
def test_the_graphed_shapes_match_plain(
    tiny_pair, plain_reference, method: str, attention: str
) -> None:
    """Padded batch buckets, padded verify widths and the draft's greedy chain: the inputs a
    CUDA graph replays, run eagerly on the CPU, give the plain output token for token, with
    the KV cache gathered or read in place (eager FlexAttention: the CUDA path's reference;
    it scores every slot of the cache, so the cache is kept small)."""
    target, draft = tiny_pair
    extra = {"draft": str(draft)} if method == "draft" else {"method": method}
    if attention == "flex":
        extra["kv_cache_bytes"] = 8_000_000
    few = 10  # 6 at a time: buckets 8 and 4 (pad rows), then smaller ones as requests finish
    outputs, engine = run(
        target, PROMPTS[:few], static_shapes=True, max_batch_size=6, attention=attention, **extra
    )
    assert outputs == plain_reference[:few]
    kinds = {key[0] for key in engine.runner.shapes}
    assert kinds == {"forward"}  # plain steps and verifies; prefills are wider, run eagerly
    widths = {key[2] for key in engine.runner.shapes}
    assert max(widths) == (1 if method == "none" else 1 + engine.k)  # the verify's k + 1
    if method == "draft":
        assert any(key[0] == "chain" for key in engine.drafter.runner.shapes)
