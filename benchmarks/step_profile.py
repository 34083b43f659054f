"""Where a plain decode step's time goes: kernels by kind, and the weights' read bandwidth.

Runs the roofline check's Llama 3.1 8B-shaped target (random bf16 weights, paged cache,
context 256) at batch 1: times the CUDA-graphed step, then profiles the same shapes eagerly
and groups its kernels (matmuls, attention, the rest). Graph time minus kernel time is what
launching costs inside the graph; matmul time against the weights' bytes is how near the
matmuls themselves come to the HBM bandwidth (`--bandwidth`, TB/s, default the H200's 4.8).

Usage (on a CUDA machine): python benchmarks/step_profile.py [--batch 1] [--top 12]
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from functools import partial

import torch
from roofline_check import BLOCK, TARGET, feeds, median_seconds, runner
from torch.profiler import ProfilerActivity, profile

from spectune.engine.model_runner import ModelRunner

KINDS = (  # first match wins, on the lower-cased kernel name
    ("matmul", ("gemm", "gemv", "cutlass", "nvjet", "splitk", "sm90_xmma", "cublas")),
    ("attention", ("fmha", "flash", "attention", "efficient")),
    ("copy/index", ("index", "gather", "scatter", "copy", "cat", "roll")),
    ("norm", ("norm",)),
)


def kind_of(name: str) -> str:
    lower = name.lower()
    return next((k for k, marks in KINDS if any(m in lower for m in marks)), "elementwise/other")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--bandwidth", type=float, default=4.8, help="HBM TB/s")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--compile", action="store_true", help="compile the small ops")
    parser.add_argument("--attention", choices=("flex", "gather"), default="flex")
    args = parser.parse_args()
    torch.manual_seed(0)
    in_place = args.attention == "flex"
    run = runner(TARGET, args.batch, args.context, 0, args.compile, in_place)
    per_seq = -(-(args.context + 1) // BLOCK)
    fed = feeds(args.batch, args.context, 1, per_seq)
    graphed = median_seconds(partial(run.forward, fed, False), 20)
    run = ModelRunner(  # the same model and shapes, eagerly, kernel by kernel
        run.model,
        args.batch * per_seq + 1,
        BLOCK,
        args.context + 1,
        cuda_graphs=False,
        static_shapes=True,
        in_place_attention=in_place,
    )
    eager = median_seconds(partial(run.forward, fed, False), 20)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            run.forward(fed, False)
        torch.cuda.synchronize()
    per_kind: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    kernels = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if e.count == 0 or us == 0 or e.key.startswith(("cudaGraph", "Memcpy", "Memset")):
            continue
        kernels.append((us / 5, e.count / 5, e.key))
        per_kind[kind_of(e.key)][0] += e.count / 5
        per_kind[kind_of(e.key)][1] += us / 5
    weights = sum(p.numel() * p.element_size() for p in run.model.parameters())
    busy = sum(us for us, _, _ in kernels)
    name = torch.cuda.get_device_name()
    how = f"attention {args.attention}" + (", small ops compiled" if args.compile else "")
    print(f"{name}: 8B shapes bf16, batch {args.batch}, context {args.context}, {how}")
    print(
        f"step ms: graphed {graphed * 1e3:.2f}, eager {eager * 1e3:.2f}, kernels {busy / 1e3:.2f} "
        f"(launch cost in the graph {graphed * 1e3 - busy / 1e3:.2f})"
    )
    print(
        f"weights {weights / 1e9:.2f} GB: graphed step at {weights / graphed / 1e12:.2f} TB/s = "
        f"{weights / graphed / 1e12 / args.bandwidth:.0%} of {args.bandwidth} TB/s"
    )
    print("kind | kernels per step | us per step | share of kernel time")
    for kind, (count, us) in sorted(per_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"{kind} | {count:.0f} | {us:.0f} | {us / busy:.0%}")
    matmul_us = per_kind["matmul"][1]
    if matmul_us:
        rate = weights / (matmul_us / 1e6) / 1e12
        print(f"matmuls alone read the weights at {rate:.2f} TB/s = {rate / args.bandwidth:.0%}")
    print(f"top {args.top} kernels: us per step | launches per step | name")
    for us, count, name in sorted(kernels, reverse=True)[: args.top]:
        print(f"{us:8.1f} | {count:4.0f} | {name[:110]}")


if __name__ == "__main__":
    main()
