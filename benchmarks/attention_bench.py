"""Attention over the paged KV cache: today's gather + SDPA against FlexAttention in place.

Today each layer gathers every sequence's blocks into a new [B, S, kv, d] tensor and runs
SDPA with an explicit mask. FlexAttention can read the cache where it lies: K and V are the
whole cache seen as one sequence ([1, kv, slots, d], broadcast over the batch), and a block
mask lists each row's physical blocks (its block table), with a mask_mod that maps a
physical slot back to its position. Both run for Llama 3.1 8B's attention shapes (32 query
heads, 8 KV heads, 128 dims, bf16), `--layers` calls per timed forward (masks built once per
forward, as the runner does), at decode (1 position) and verify (k + 1) widths; outputs are
compared for agreement.

Usage (on a CUDA machine): python benchmarks/attention_bench.py [--batches 1,16,64,256]
"""

from __future__ import annotations

import argparse
import statistics
import time
import traceback
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from spectune.engine.model_runner import paged_batch

HEADS, KV_HEADS, DIM = 32, 8, 128


def gather_sdpa(
    q: Tensor, kc: Tensor, vc: Tensor, pos: Tensor, tables: Tensor, bs: int, layers: int
) -> Tensor:
    """What engine/model.py does in each of `layers` layers (the mask once per forward):
    q [B, h, L, d]; kc, vc [slots, kv, d]."""
    paged = paged_batch(pos, pos, tables, bs)
    for _ in range(layers):
        keys = paged.gather(kc).transpose(1, 2)
        values = paged.gather(vc).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=paged.mask, enable_gqa=True)
    return out


def block_mask(pos: Tensor, tables: Tensor, bs: int, slots: int) -> BlockMask:
    """Each row reads its own blocks, up to its last position, causally within the window."""
    b, w = tables.shape
    to_logical = torch.full((b, slots // bs), -1, dtype=torch.long, device=tables.device)
    to_logical.scatter_(1, tables, torch.arange(w, device=tables.device).expand(b, w))
    used = (pos[:, -1] // bs + 1).to(torch.int32).view(b, 1, 1)

    def mask_mod(row: Tensor, head: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        logical = to_logical[row, kv // bs]
        return (logical >= 0) & (logical * bs + kv % bs <= pos[row, q])

    indices = torch.zeros(b, 1, 1, slots // bs, dtype=torch.int32, device=tables.device)
    indices[..., :w] = tables.view(b, 1, 1, w)  # the mask must span every physical block
    return BlockMask.from_kv_blocks(
        used,
        indices,
        BLOCK_SIZE=(128, bs),
        mask_mod=mask_mod,
        seq_lengths=(pos.shape[1], slots),
    )


def flex_paged(
    flex: Callable,
    q: Tensor,
    kc: Tensor,
    vc: Tensor,
    pos: Tensor,
    tables: Tensor,
    bs: int,
    layers: int,
) -> Tensor:
    """The same through FlexAttention: the block mask once per forward, the cache in place."""
    mask = block_mask(pos, tables, bs, kc.shape[0])
    k, v = (c.unsqueeze(0).transpose(1, 2) for c in (kc, vc))  # [1, kv, slots, d], no copy
    for _ in range(layers):
        out = flex(q, k, v, block_mask=mask, enable_gqa=True)
    return out


def timed(fn: Callable[[], object], repeats: int, cuda: bool) -> float:
    """Median seconds of one call: on CUDA a graph replay of it, so that launches from
    Python do not hide the device time (as in the engine, which graphs every decode shape)."""
    for _ in range(2):
        fn()
    run = fn
    if cuda:
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run = graph.replay
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument("--widths", default="1,5")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--block-size", type=int, default=16, help="the engine's default")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--eager-flex", action="store_true", help="no torch.compile (CPU check)")
    args = parser.parse_args()
    dev, bs, cuda = torch.device(args.device), args.block_size, args.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    flex = flex_attention if args.eager_flex else torch.compile(flex_attention, dynamic=False)
    print(f"{args.device}: 8B attention shapes, context {args.context}, block {bs}, {dtype}")
    print("batch | width | gather+SDPA ms | flex in place ms | ratio | max |diff|")
    for b in (int(x) for x in args.batches.split(",")):
        per_seq = -(-(args.context + 9) // bs)
        slots = (b * per_seq + 1) * bs
        kc = torch.randn(slots, KV_HEADS, DIM, dtype=dtype, device=dev)
        vc = torch.randn(slots, KV_HEADS, DIM, dtype=dtype, device=dev)
        perm = torch.randperm(b * per_seq, device=dev) + 1  # blocks scattered, as in use
        tables = perm.view(b, per_seq)
        for width in (int(x) for x in args.widths.split(",")):
            start = torch.full((b, 1), args.context, device=dev)
            pos = start + torch.arange(width, device=dev)
            q = torch.randn(b, HEADS, width, DIM, dtype=dtype, device=dev)
            inputs = (q, kc, vc, pos, tables, bs, args.layers)
            ref = gather_sdpa(*inputs)
            t_ref = timed(partial(gather_sdpa, *inputs), args.repeats, cuda)
            try:
                out = flex_paged(flex, *inputs)
                diff = (out.float() - ref.float()).abs().max().item()
                t_flex = timed(partial(flex_paged, flex, *inputs), args.repeats, cuda)
            except Exception:  # report and go on: the point is to learn whether it runs here
                print(
                    " | ".join(
                        line for line in traceback.format_exc().splitlines() if "Error" in line
                    )[-600:]
                )
                print(f"{b} | {width} | {t_ref * 1e3:.3f} | failed | - | -")
                continue
            print(
                f"{b} | {width} | {t_ref * 1e3:.3f} | {t_flex * 1e3:.3f} | "
                f"{t_flex / t_ref:.2f} | {diff:.3g}"
            )


if __name__ == "__main__":
    main()
