"""The CUDA path: same greedy outputs as the CPU, lossless speculation, CUDA graphs used."""

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
    engine = LLMEngine(
        EngineConfig(model=str(target), device=device, dtype=dtype, max_batch_size=16, **kw)
    )
    return [c.token_ids for c in engine.generate(PROMPTS, PARAMS)], engine


def test_cuda_plain_matches_cpu_and_replays_graphs(tiny_pair) -> None:
    cpu, _ = outputs(tiny_pair[0], "cpu")
    cuda, engine = outputs(tiny_pair[0], "cuda")
    same = sum(a == b for a, b in zip(cpu, cuda, strict=True))
    assert same >= len(PROMPTS) - 1  # fp32 kernels differ in rounding; a near-tie may flip one
    assert engine.runner._graphs


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_cuda_speculation_is_lossless(tiny_pair, method: str, dtype: str) -> None:
    target, draft = tiny_pair
    extra = {"draft": str(draft)} if method == "draft" else {"method": "ngram"}
    plain, _ = outputs(target, "cuda", dtype, cuda_graphs=False)
    spec, engine = outputs(target, "cuda", dtype, cuda_graphs=False, **extra)
    if dtype == "float32":
        assert spec == plain
    else:  # bf16 verify and decode round differently; the bulk must still agree
        assert sum(a == b for a, b in zip(spec, plain, strict=True)) >= len(PROMPTS) * 0.8
    assert sum(it.accepted for it in engine.iterations) > 0
