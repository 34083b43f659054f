"""The batch sweep on simulated GPU SKUs finds the crossovers the device-time model predicts:
within one batch bucket of the analytic value, in the order the SKUs' FLOP/s-to-bandwidth
ratios give (A100 < H100 < L4), higher for longer contexts, lower for lower acceptance.

The analytic value is computed for what the sweep ran: its contexts, and the tokens each
sequence drafted and committed per spec step as measured (n-gram lookup drafts fewer than k
tokens where it finds no match; the iid-acceptance formula is not what real text does).
The clock is the model's, so the measured step times carry no noise at all.

Longer contexts are simulated (extra cached tokens per sequence on the device): the tiny
pair was trained on 128-token sequences, and with 768-token prompts its acceptance fell from
0.79 to 0.24 (draft) and 0.23 to 0.11 (n-gram), which would confound the context's effect.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from spectune.engine.bench.batch_sweep import SweepSettings, sweep
from spectune.engine.bench.workload import shipped_prompts
from spectune.engine.config import EngineConfig
from spectune.engine.contract import BATCH_BUCKETS, batch_bucket
from spectune.engine.crossover import aggregate_median, crossover_of, speedup_curve
from spectune.engine.device_time import LLAMA_1B, LLAMA_8B, SKUS, Setting, analytic_crossover
from spectune.engine.engine import LLMEngine

pytestmark = pytest.mark.slow
K = 4
SIZES = (64, 96, 128, 192, 256, 384)


@dataclass(frozen=True)
class Measured:
    crossover: float
    analytic: float
    acceptance: float


@cache
def measure(
    draft: Path | None, sku: str, extra_context: int = 0, sizes: tuple[int, ...] = SIZES
) -> Measured:
    """The sweep's crossover and the model's for what it ran (cached: tests share sweeps)."""
    target = Path(".cache/models/tiny-target")
    method = {"draft": str(draft)} if draft else {"method": "ngram"}
    engine = LLMEngine(
        EngineConfig(
            model=str(target), k=K, max_batch_size=512, kv_cache_bytes=1 << 30,
            simulate_device=sku, simulate_extra_context=extra_context, **method,
        )
    )  # fmt: skip
    engine.simulation.hold = False
    prompts = [engine.tokenizer.encode(p.text).ids for p in shipped_prompts(64, 64)]
    settings = SweepSettings(sizes, iterations=4, stop_after=1)
    timed = [it for batch in sweep(engine, prompts, settings) for it in batch]
    found = crossover_of(speedup_curve(aggregate_median(timed)))
    assert found.status == "crosses", found
    spec = [it for it in timed if it.mode == "spec"]
    seqs = sum(it.batch_size for it in spec)
    generated = settings.tokens_per_sequence(K, 2) / 2
    context = sum(map(len, prompts)) / len(prompts) + generated + extra_context
    analytic = analytic_crossover(
        Setting(
            SKUS[sku], LLAMA_8B, LLAMA_1B if draft else None, K, 0.0, round(context),
            tokens=sum(it.tokens for it in spec) / seqs,
            verified=sum(it.drafted for it in spec) / seqs,
        )
    )  # fmt: skip
    assert analytic is not None
    drafted = sum(it.drafted for it in spec)
    return Measured(found.batch, analytic, sum(it.accepted for it in spec) / drafted)


def buckets_apart(a: float, b: float) -> int:
    return abs(
        BATCH_BUCKETS.index(batch_bucket(int(a))) - BATCH_BUCKETS.index(batch_bucket(int(b)))
    )


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_each_sku_crosses_where_the_model_says_in_the_ratio_order(tiny_pair, method) -> None:
    draft = tiny_pair[1] if method == "draft" else None
    found = {sku: measure(draft, sku) for sku in ("A100", "H100", "L4")}
    for sku, m in found.items():
        assert buckets_apart(m.crossover, m.analytic) <= 1, (sku, m)
    ratio = {sku: SKUS[sku].flops / SKUS[sku].bandwidth for sku in found}
    assert ratio["A100"] < ratio["H100"] < ratio["L4"]
    assert found["A100"].crossover < found["H100"].crossover < found["L4"].crossover, found


def test_longer_contexts_cross_later(tiny_pair) -> None:
    short, long = measure(None, "A100"), measure(None, "A100", 512, SIZES[1:])
    assert abs(short.acceptance - long.acceptance) < 0.05  # the same real text
    assert buckets_apart(long.crossover, long.analytic) <= 1, long
    assert long.crossover > short.crossover * 1.2, (short, long)


def test_lower_acceptance_crosses_earlier(tiny_pair, tmp_path: Path) -> None:
    """The same draft with noise in its weights: the same cost per forward, fewer accepted."""
    noisy = tmp_path / "noisy-draft"
    shutil.copytree(tiny_pair[1], noisy)
    weights = load_file(noisy / "model.safetensors")
    rng = torch.Generator().manual_seed(0)
    save_file(
        {n: w + 0.3 * w.std() * torch.randn(w.shape, generator=rng) if w.ndim > 1 else w
         for n, w in weights.items()},
        noisy / "model.safetensors",
    )  # fmt: skip
    good, poor = (
        measure(tiny_pair[1], "H100"),
        measure(noisy, "H100", sizes=(48, 64, 96, 128, 192)),
    )
    assert poor.acceptance < good.acceptance - 0.2, (good, poor)
    assert buckets_apart(poor.crossover, poor.analytic) <= 1, poor
    assert poor.crossover < good.crossover / 1.4, (good, poor)
