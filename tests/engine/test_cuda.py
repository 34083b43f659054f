"""The CUDA path: same greedy outputs as the CPU, lossless speculation graphed and not, every
decode shape (plain step, verify, the draft's greedy chain) replayed from a CUDA graph with
attention reading the paged cache in place (FlexAttention), and with compiled small ops."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spectune.engine.config import EngineConfig
from spectune.engine.engine import LLMEngine
from spectune.engine.sequence import SamplingParams

from .prompts import PROMPTS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
PARAMS = SamplingParams(max_tokens=32, ignore_eos=True)


def outputs(
    target: Path, device: str, dtype: str = "float32", **kw: object
) -> tuple[list, LLMEngine]:
    # A fixed KV size: the in-place attention compiles once per shape, and the cache's size
    # is part of the shape (85% of free memory would differ between engines).
    settings = dict(max_batch_size=16, kv_cache_bytes=1 << 28) | kw
    engine = LLMEngine(EngineConfig(model=str(target), device=device, dtype=dtype, **settings))
    return [c.token_ids for c in engine.generate(PROMPTS, PARAMS)], engine


def test_cuda_plain_matches_cpu_and_replays_graphs(tiny_pair) -> None:
    cpu, _ = outputs(tiny_pair[0], "cpu")
    cuda, engine = outputs(tiny_pair[0], "cuda")
    same = sum(a == b for a, b in zip(cpu, cuda, strict=True))
    assert same >= len(PROMPTS) - 1  # fp32 kernels differ in rounding; a near-tie may flip one
    assert engine.runner.use_graphs and engine.runner.shapes
    assert engine.runner.in_place_attention  # the CUDA default: FlexAttention over the cache


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_cuda_speculation_is_lossless(tiny_pair, method: str, dtype: str, graphs: bool) -> None:
    target, draft = tiny_pair
    extra = {"draft": str(draft)} if method == "draft" else {"method": "ngram"}
    plain, _ = outputs(target, "cuda", dtype, cuda_graphs=graphs)
    spec, engine = outputs(target, "cuda", dtype, cuda_graphs=graphs, **extra)
    if graphs:
        assert any(key[2] == 1 + engine.k for key in engine.runner.shapes)  # the verify
        if method == "draft":
            assert any(key[0] == "chain" for key in engine.drafter.runner.shapes)
    if dtype == "float32":
        assert spec == plain
    else:  # bf16 verify and decode round differently; the bulk must still agree
        assert sum(a == b for a, b in zip(spec, plain, strict=True)) >= len(PROMPTS) * 0.8
    assert sum(it.accepted for it in engine.iterations) > 0


def test_cuda_compiled_ops_keep_speculation_lossless(tiny_pair) -> None:
    """torch.compile'd small ops (EngineConfig.compile) under the graphs: speculation gives
    the compiled plain output token for token, and that stays the eager one up to a
    near-tie."""
    target, draft = tiny_pair
    eager, _ = outputs(target, "cuda")
    plain, _ = outputs(target, "cuda", compile=True)
    spec, engine = outputs(target, "cuda", compile=True, draft=str(draft))
    assert spec == plain
    assert sum(a == b for a, b in zip(eager, plain, strict=True)) >= len(PROMPTS) - 1
    assert any(key[0] == "chain" for key in engine.drafter.runner.shapes)
