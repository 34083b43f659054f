"""Why the CPU runner stores linear weights column-major and gathers whole KV blocks.

One decode step of the model (runner.forward, 176 cached positions per sequence) at
batch 1 and 16, with the weights as the runner lays them out (column-major) and as they
are loaded (row-major), alternating A B A B; then the KV gather of one layer, whole
blocks through index_select vs slot-by-slot indexing. Medians and paired ratios.

Usage: .venv/bin/python benchmarks/layout_bench.py [--model bench-target] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from engine_bench import paired  # the sibling script: A B A B rounds, medians

from spectune.engine.checkpoint import load_checkpoint
from spectune.engine.model import PagedBatch
from spectune.engine.model_runner import Feed, ModelRunner
from spectune.engine.zoo.registry import resolve_model

CONTEXT = 176
BLOCK = 16


def median_ms(fn: Callable[[], object], calls: int = 20) -> float:
    fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def set_layout(runner: ModelRunner, column_major: bool) -> None:
    for module in runner.model.modules():
        if (
            isinstance(module, torch.nn.Linear)
            and module.weight is not runner.model.embed_tokens.weight
        ):
            w = module.weight.data.contiguous()  # row-major
            module.weight.data = w.t().contiguous().t() if column_major else w


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="bench-target")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    ck = load_checkpoint(resolve_model(args.model), args.model, torch.device("cpu"), torch.float32)
    blocks = CONTEXT // BLOCK + 1
    runner = ModelRunner(ck.model, 64 * blocks + 1, BLOCK, 2048, cuda_graphs=False)
    print(f"model {args.model}, {torch.get_num_threads()} threads, {args.repeats} rounds, medians")
    print("\n| decode step | column-major ms | row-major ms | row / column |\n|---|---|---|---|")
    with torch.inference_mode():
        for batch in (1, 16):
            feeds = [
                Feed([65], CONTEXT, list(range(1 + i * blocks, 1 + (i + 1) * blocks)))
                for i in range(batch)
            ]

            def step(column_major: bool, feeds: list[Feed] = feeds) -> float:
                set_layout(runner, column_major)
                return median_ms(lambda: runner.forward(feeds, all_logits=False))

            p = paired(lambda: step(False), lambda: step(True), args.repeats)
            print(f"| batch {batch} | {p.b:.2f} | {p.a:.2f} | {p.ratio:.2f}x |")
        cache = runner.caches[0][0]
        print("\n| KV gather, one layer | whole blocks ms | slot by slot ms | slots / blocks |")
        print("|---|---|---|---|")
        for batch in (1, 16, 64):
            tables = (torch.randperm(batch * blocks) + 1).view(batch, blocks)
            paged = PagedBatch(tables[:, :1], tables, BLOCK, torch.ones(1, dtype=torch.bool))
            slots = (tables.unsqueeze(-1) * BLOCK + torch.arange(BLOCK)).flatten(1)
            p = paired(
                lambda s=slots: median_ms(lambda: cache[s], 50),
                lambda g=paged: median_ms(lambda: g.gather(cache), 50),
                args.repeats,
            )
            print(f"| batch {batch} | {p.b:.3f} | {p.a:.3f} | {p.ratio:.2f}x |")


if __name__ == "__main__":
    main()
