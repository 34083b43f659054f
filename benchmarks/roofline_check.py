"""The simulated SKUs' roofline (engine/device_time.py) against a real GPU.

Builds random-weight models with the virtual target's and draft's shapes (Llama 3.1 8B and
Llama 3.2 1B) and runs our own engine's forwards through ModelRunner on CUDA as the engine
serves them: the paged KV cache read in place by FlexAttention (or `--attention gather`),
CUDA graphs for every decode shape (the plain step, the verify forward and the draft's k
forwards as one greedy chain). Prints per batch size the measured and the modelled seconds
of a plain step, a verify forward and the k draft forwards, then the speedup at a given
acceptance and both crossovers. Weights are random (normal init, never zeros): only the
time is of interest, and it does not depend on them.

Usage (on a CUDA machine): python benchmarks/roofline_check.py --sku H200 [--json FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path

import torch

from spectune.engine.device_time import (
    LLAMA_1B,
    LLAMA_8B,
    SKUS,
    Setting,
    analytic_crossover,
    expected_tokens,
    plain_step,
    spec_step,
)
from spectune.engine.model import ModelConfig, Transformer
from spectune.engine.model_runner import Feed, ModelRunner

VOCAB = 128256
TARGET = ModelConfig(VOCAB, 4096, 14336, 32, 32, 8, 128, 8192, rope_theta=500000.0)
DRAFT = ModelConfig(
    VOCAB, 2048, 8192, 16, 32, 8, 64, 8192, rope_theta=500000.0, tie_word_embeddings=True
)
BLOCK = 16


def runner(
    cfg: ModelConfig, batch: int, context: int, k: int, compile: bool, in_place: bool = True
) -> ModelRunner:
    with torch.device("cuda"):
        model = Transformer(cfg).to(torch.bfloat16).eval()
    per_seq = -(-(context + k + 1) // BLOCK)
    return ModelRunner(
        model,
        batch * per_seq + 1,
        BLOCK,
        context + k + 1,
        cuda_graphs=True,
        in_place_attention=in_place,
        compile_layers=compile,
    )


def feeds(batch: int, context: int, width: int, per_seq: int) -> list[Feed]:
    """`batch` sequences with `context` cached tokens, each feeding `width` new ones."""
    return [
        Feed([1 + i % 1000] * width, context, list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)))
        for i in range(batch)
    ]


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    for _ in range(3):
        run()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def crossover(speedups: dict[int, float]) -> float | None:
    sizes = sorted(speedups)
    if speedups[sizes[0]] < 1:
        return float(sizes[0])
    for a, b in itertools.pairwise(sizes):
        if speedups[b] < 1:
            return a + (speedups[a] - 1) / (speedups[a] - speedups[b]) * (b - a)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sku", choices=tuple(SKUS), default="H200")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--acceptance", type=float, default=0.7)
    parser.add_argument("--batches", default="1,4,16,32,64,96,128,192,256")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--compile", action="store_true", help="compile the small ops")
    parser.add_argument("--attention", choices=("flex", "gather"), default="flex")
    args = parser.parse_args()
    sku, k, ctx = SKUS[args.sku], args.k, args.context
    batches = [int(b) for b in args.batches.split(",")]
    largest, per_seq = max(batches), -(-(ctx + k + 1) // BLOCK)
    torch.manual_seed(0)
    in_place = args.attention == "flex"
    target = runner(TARGET, largest, ctx, k, args.compile, in_place)
    draft = runner(DRAFT, largest, ctx, k, args.compile, in_place)
    tokens = expected_tokens(args.acceptance, k)
    rows = []
    print(
        f"{torch.cuda.get_device_name()} vs simulated {args.sku}: Llama-8B shapes, 1B draft, "
        f"bf16, context {ctx}, k {k}, acceptance {args.acceptance}"
        f", attention {args.attention}{', small ops compiled' if args.compile else ''}"
    )
    print(  # docs/PERFORMANCE.md's table format
        "| batch | plain ms real/model | verify ms real/model | k drafts ms real/model | "
        "speedup real/model |\n|---|---|---|---|---|"
    )
    for b in batches:
        one, wide = feeds(b, ctx, 1, per_seq), feeds(b, ctx, k + 1, per_seq)
        plain = median_seconds(partial(target.forward, one, False), args.repeats)
        verify = median_seconds(partial(target.forward, wide, True), args.repeats)
        drafts = median_seconds(partial(draft.greedy_chain, one, k), args.repeats)
        contexts = [ctx] * b
        m_plain = plain_step(sku, LLAMA_8B, contexts)
        m_spec = spec_step(sku, LLAMA_8B, LLAMA_1B, k, contexts)
        m_draft = m_spec - spec_step(sku, LLAMA_8B, None, k, contexts)
        real, model = tokens * plain / (verify + drafts), tokens * m_plain / m_spec
        rows.append(
            dict(
                batch=b,
                plain=plain,
                verify=verify,
                drafts=drafts,
                model_plain=m_plain,
                model_spec=m_spec,
                model_drafts=m_draft,
                speedup=real,
                model_speedup=model,
            )
        )
        print(
            f"| {b} | {plain * 1e3:.2f} / {m_plain * 1e3:.2f} | "
            f"{verify * 1e3:.2f} / {(m_spec - m_draft) * 1e3:.2f} | "
            f"{drafts * 1e3:.2f} / {m_draft * 1e3:.2f} | {real:.2f} / {model:.2f} |"
        )
    measured = crossover({r["batch"]: r["speedup"] for r in rows})
    analytic = analytic_crossover(Setting(sku, LLAMA_8B, LLAMA_1B, k, args.acceptance, ctx))
    print(f"crossover: real {measured} / model {analytic}")
    if args.json:
        args.json.write_text(
            json.dumps(
                dict(
                    sku=asdict(sku),
                    rows=rows,
                    measured=measured,
                    analytic=analytic,
                    args=vars(args) | {"json": None},
                ),
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
