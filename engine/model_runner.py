"""Everything on the device: the model, its paged KV cache, batch tensors, CUDA graphs.

Sequences never reach the model: a `Feed` says which tokens to run from which position
into which blocks, and the runner turns a list of feeds into padded tensors. On CUDA, every
decode shape replays a CUDA graph captured lazily per padded batch size and width: plain
steps (one token), verify forwards (k + 1), the draft's first forward and its whole greedy
loop (`greedy_chain`). Only prefills and catch-ups, wider than MAX_STATIC_WIDTH, run eagerly:
at batch 1 an eager verify cost 2x a graphed plain step on an H200, all of it launches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from spectune.engine.block_manager import blocks_for
from spectune.engine.model import PagedBatch, Transformer, rotary_split, swiglu

GRAPH_BATCH_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
MAX_STATIC_WIDTH = 9  # tokens per sequence in a graphed forward: a verify at k up to 8

log = logging.getLogger("spectune.engine")


@dataclass(frozen=True)
class Feed:
    tokens: list[int]
    start: int  # absolute position of tokens[0]
    block_table: list[int]


def paged_batch(
    positions: Tensor, slot_mapping: Tensor, block_tables: Tensor, block_size: int
) -> PagedBatch:
    """The gather path's attention mask from block tables; pure tensor ops so a CUDA graph
    can capture it."""
    key_pos = torch.arange(block_tables.shape[1] * block_size, device=block_tables.device)
    mask = (key_pos.view(1, 1, -1) <= positions.unsqueeze(-1)).unsqueeze(1)  # [B, 1, L, S]
    return PagedBatch(slot_mapping, block_tables, block_size, mask=mask)


def paged_in_place(
    positions: Tensor,
    slot_mapping: Tensor,
    block_tables: Tensor,
    block_size: int,
    blocks: Tensor,
) -> PagedBatch:
    """FlexAttention's block mask: row b visits the blocks of its table that hold positions
    up to its last (the sparsity: all the kernel reads), and a key is visible when its block
    is the row's and its position (the block's index in the row's table times the block
    size, plus its offset) is at most the query's. `blocks` [2, num_blocks] records each
    block's row (-1: none) and index, rewritten every forward (ids are unique across rows);
    scratch block 0 belongs to no row, so pad rows see no key and come out zero. Pure
    tensor ops, graph-capturable."""
    from torch.nn.attention.flex_attention import BlockMask  # 0.5 s to import: only if used

    b, w = block_tables.shape
    device = block_tables.device
    owner, index = blocks[0], blocks[1]
    owner.fill_(-1)  # blocks of no row in this batch (eager Flex evaluates every key)
    owner[block_tables.flatten()] = torch.arange(b, device=device).repeat_interleave(w)
    index[block_tables.flatten()] = torch.arange(w, device=device).repeat(b)
    owner[:1].fill_(-1)  # a kernel: assigning a Python scalar would copy from the host
    visited = (positions[:, -1] // block_size + 1).to(torch.int32).view(b, 1, 1)
    # Flex wants the mask to span every block of the cache; rows read only their first ones.
    indices = torch.zeros(b, 1, 1, blocks.shape[1], dtype=torch.int32, device=device)
    indices[..., :w] = block_tables.view(b, 1, 1, w)

    def visible(row: Tensor, head: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        block = kv // block_size
        mine = owner[block] == row
        return mine & (index[block] * block_size + kv % block_size <= positions[row, q])

    mask = BlockMask.from_kv_blocks(
        visited,
        indices,
        BLOCK_SIZE=(128, block_size),
        mask_mod=visible,
        seq_lengths=(positions.shape[1], blocks.shape[1] * block_size),
        compute_q_blocks=False,  # inference only: the transposed index serves the backward
    )
    return PagedBatch(slot_mapping, block_tables, block_size, block_mask=mask)


def _column_major_linears(model: Transformer) -> None:
    """Store each linear weight [out, in] as the transpose of a contiguous [in, out] tensor.

    Same values, same shapes; MKL's sgemm then skips repacking the weight on every call,
    which makes small-batch matmuls 2-3x faster on the CPU (16 rows through a 512 x 2816
    weight: 777 -> 281 us; benchmarks/layout_bench.py times whole steps). A weight shared
    with the embedding table stays row-major.
    """
    shared = model.embed_tokens.weight
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight is not shared:
            module.weight.data = module.weight.data.t().contiguous().t()


def _compile_layers(model: Transformer) -> None:
    """torch.compile the small ops between the matmuls: each norm, the rotary embedding
    with the q/k/v split, the SwiGLU activation; each becomes one fused kernel. An H200
    profile of the 8B plain step at batch 1 (benchmarks/step_profile.py) found the matmuls
    reading the weights at 84% of HBM bandwidth but the whole step at 57%: some 600 small
    kernels took the rest. Matmuls, cache writes and attention stay eager: compiling whole
    layers made the step 4x slower at batch 256 on the H200 (cause not found)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    rotary = torch.compile(rotary_split, dynamic=True, fullgraph=True)
    activation = torch.compile(swiglu, dynamic=True, fullgraph=True)
    model.norm.compile(dynamic=True, fullgraph=True)
    for layer in model.layers:
        layer.input_layernorm.compile(dynamic=True, fullgraph=True)
        layer.post_attention_layernorm.compile(dynamic=True, fullgraph=True)
        layer.self_attn.rotary = rotary
        layer.mlp.activation = activation


@dataclass
class _Static:
    """One fixed-shape forward: its input buffers, and on CUDA the graph that reads them.

    Every tensor the graph reads must outlive it: a freed one's memory is reused and
    replays read whatever lands there (seen on an H200: gather indices out of bounds).
    """

    inputs: dict[str, Tensor]
    run: Callable[[], Tensor]  # eager: computes the output; graphed: replays, returns it


class ModelRunner:
    def __init__(
        self,
        model: Transformer,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        cuda_graphs: bool,
        static_shapes: bool = False,
        in_place_attention: bool = False,
        compile_layers: bool = False,
    ) -> None:
        """cuda_graphs: on CUDA, replay a graph per padded shape. static_shapes: run those
        padded shapes eagerly on any device (how the CPU tests prove them lossless).
        in_place_attention: those shapes read the KV cache in place through FlexAttention
        (paged_in_place); wider ones (prefills) always gather. compile_layers: fuse each
        decoder layer's small ops (see _compile_layers); on the CPU Inductor builds them as C++
        kernels, which needs a compiler (Flex stays eager there: torch 2.15's C++ template for
        it does not compile our block masks)."""
        self.model = model
        if model.embed_tokens.weight.device.type == "cpu":
            _column_major_linears(model)
        if compile_layers:
            _compile_layers(model)
        cfg = model.config
        weight = model.embed_tokens.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.block_size = block_size
        shape = (num_blocks * block_size, cfg.num_kv_heads, cfg.head_dim)
        self.caches = [
            (
                torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device),
            )
            for _ in range(cfg.num_layers)
        ]
        self.max_blocks = blocks_for(max_model_len, block_size)
        self.in_place_attention = in_place_attention
        self._blocks = torch.zeros(2, num_blocks, dtype=torch.long, device=self.device)
        self.use_graphs = cuda_graphs and self.device.type == "cuda"
        self.static_shapes = self.use_graphs or static_shapes
        self._statics: dict[tuple, _Static] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self.on_forward: Callable[[list[Feed]], None] | None = None  # a simulated device's meter

    @property
    def shapes(self) -> list[tuple]:
        """The fixed shapes built so far (graphs, on CUDA): ("forward", batch bucket, width,
        all_logits) or ("chain", batch bucket, width, steps)."""
        return list(self._statics)

    @torch.inference_mode()
    def forward(self, feeds: list[Feed], all_logits: bool) -> Tensor:
        """Logits [B, M, V] in float32: at every fed position, or at each feed's last one."""
        longest = max(len(f.tokens) for f in feeds)
        if self._fits_static(feeds, longest):
            key = ("forward", _bucket(len(feeds)), longest, all_logits)
            logits = self._launch(key, feeds, longest)[: len(feeds)]
        else:
            ids, pos, slots, tables, index = self._prepare(feeds, longest)
            logits = self._run(ids, pos, slots, tables, None if all_logits else index)
        if self.on_forward is not None:
            self.on_forward(feeds)
        return logits

    @torch.inference_mode()
    def greedy_chain(self, feeds: list[Feed], steps: int) -> Tensor:
        """[B, steps] greedy tokens: the argmax after each feed's last token, then `steps - 1`
        one-token forwards, each fed the token before it; one graph on CUDA, one host sync.

        The draft loop of a greedy batch: the n-th token goes to position last + n of its
        sequence, whose block table must already hold it.
        """
        longest = max(len(f.tokens) for f in feeds)
        if self._fits_static(feeds, longest):
            key = ("chain", _bucket(len(feeds)), longest, steps)
            tokens = self._launch(key, feeds, longest)[: len(feeds)]
        else:
            tokens = self._chain(*self._prepare(feeds, longest), steps, in_place=False)
        if self.on_forward is not None:
            self.on_forward(feeds)
            for n in range(1, steps):
                self.on_forward([Feed([0], f.start + len(f.tokens) - 1 + n, []) for f in feeds])
        return tokens

    def build(self, keys: Iterable[tuple]) -> int:
        """Build, and run once on pad rows alone, each shape of `keys` not built yet: on CUDA
        each captures its graph and compiles its Flex kernels, on the CPU the compiled small
        ops see its sizes. Returns how many were new; logs progress every 10 s."""
        todo = [key for key in dict.fromkeys(keys) if key not in self._statics]
        start = shown = time.monotonic()
        for n, key in enumerate(todo, 1):
            self._build(key).run()  # zero inputs: pad rows, writing only to scratch block 0
            if time.monotonic() - shown > 10:
                shown = time.monotonic()
                log.info("built %d of %d fixed shapes in %.0f s", n, len(todo), shown - start)
        return len(todo)

    def _fits_static(self, feeds: list[Feed], longest: int) -> bool:
        return (
            self.static_shapes
            and longest <= MAX_STATIC_WIDTH
            and len(feeds) <= GRAPH_BATCH_SIZES[-1]
            and max(len(f.block_table) for f in feeds) <= self.max_blocks
        )

    def _run(
        self,
        ids: Tensor,
        pos: Tensor,
        slots: Tensor,
        tables: Tensor,
        index: Tensor | None,
        in_place: bool = False,
    ) -> Tensor:
        if in_place:
            paged = paged_in_place(pos, slots, tables, self.block_size, self._blocks)
        else:
            paged = paged_batch(pos, slots, tables, self.block_size)
        return self.model(ids, pos, self.caches, paged, index)

    def _chain(
        self,
        ids: Tensor,
        pos: Tensor,
        slots: Tensor,
        tables: Tensor,
        index: Tensor,
        steps: int,
        in_place: bool,
    ) -> Tensor:
        """Pure tensor ops, so that a graph captures the whole loop: slots are looked up in
        the block tables on the device. Pad rows (all-zero tables) stay in scratch block 0."""
        bs = self.block_size
        token = self._run(ids, pos, slots, tables, index, in_place)[:, 0].argmax(-1)
        chosen = [token]
        last = pos.gather(1, index)  # [B, 1] position of each feed's last token
        first = torch.zeros_like(index)
        for n in range(1, steps):
            at = last + n
            slot = tables.gather(1, at // bs) * bs + at % bs
            token = self._run(token.unsqueeze(1), at, slot, tables, first, in_place)
            token = token[:, 0].argmax(-1)
            chosen.append(token)
        return torch.stack(chosen, dim=1)

    def _prepare(
        self, feeds: list[Feed], longest: int
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """ids, positions, slots [B, longest]; block tables [B, W]; each feed's last index
        [B, 1] (where its next-token logits are)."""
        bs = self.block_size
        ids, pos, slots = [], [], []
        for f in feeds:
            pad = longest - len(f.tokens)
            positions = range(f.start, f.start + len(f.tokens))
            ids.append(f.tokens + [0] * pad)
            pos.append([*positions, *[f.start + len(f.tokens) - 1] * pad])
            slots.append([f.block_table[p // bs] * bs + p % bs for p in positions] + [0] * pad)
        width = max(len(f.block_table) for f in feeds)
        tables = [f.block_table + [0] * (width - len(f.block_table)) for f in feeds]
        last = [[len(f.tokens) - 1] for f in feeds]
        return tuple(
            torch.tensor(x, dtype=torch.long, device=self.device)
            for x in (ids, pos, slots, tables, last)
        )

    def _launch(self, key: tuple, feeds: list[Feed], width: int) -> Tensor:
        """Copy the feeds into the shape's static buffers (pad rows write only to scratch
        slot 0) and run it."""
        static = self._statics.get(key) or self._build(key)
        ids, pos, slots, tables, index = self._prepare(feeds, width)
        b, w = tables.shape
        for name, src in (("ids", ids), ("pos", pos), ("slots", slots), ("index", index)):
            static.inputs[name].zero_()
            static.inputs[name][:b].copy_(src)
        static.inputs["tables"].zero_()
        static.inputs["tables"][:b, :w].copy_(tables)
        return static.run()

    def _build(self, key: tuple) -> _Static:
        """The buffers of one shape and what runs it: on CUDA, a graph captured now."""
        kind, size, width, arg = key
        zeros = dict(dtype=torch.long, device=self.device)
        inputs = {
            "ids": torch.zeros(size, width, **zeros),
            "pos": torch.zeros(size, width, **zeros),
            "slots": torch.zeros(size, width, **zeros),
            "tables": torch.zeros(size, self.max_blocks, **zeros),
            "index": torch.zeros(size, 1, **zeros),
        }
        args = tuple(inputs[name] for name in ("ids", "pos", "slots", "tables", "index"))

        def eager() -> Tensor:
            if kind == "chain":
                return self._chain(*args, steps=arg, in_place=self.in_place_attention)
            return self._run(*args[:4], None if arg else args[4], self.in_place_attention)

        if not self.use_graphs:
            self._statics[key] = _Static(inputs, eager)
            return self._statics[key]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                eager()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = eager()

        def replay() -> Tensor:
            graph.replay()
            return out

        self._statics[key] = _Static(inputs, replay)
        return self._statics[key]


def target_shapes(max_batch_size: int, k: int) -> list[tuple]:
    """The fixed shapes a target serves with at batches up to `max_batch_size`: forwards of up
    to MAX_STATIC_WIDTH tokens (plain steps, and prefills of prompts that short) and, when it
    verifies (k > 0), verifies of 1 to k + 1 tokens, since a sequence near its end drafts
    fewer. Largest batch first: on CUDA the smaller graphs then reuse the largest's memory."""
    widths = range(1, min(k + 1, MAX_STATIC_WIDTH) + 1) if k else ()
    return [
        key
        for size in _buckets_up_to(max_batch_size)
        for key in _forwards(size) + [("forward", size, w, True) for w in widths]
    ]


def draft_shapes(max_batch_size: int, k: int) -> list[tuple]:
    """A draft model's: forwards of up to MAX_STATIC_WIDTH tokens (catch-ups of what plain
    iterations committed; a proposal's first forward reads one or two, each next one one) and
    greedy chains of 1 to k steps after a first forward of one or two tokens."""
    return [
        key
        for size in _buckets_up_to(max_batch_size)
        for key in _forwards(size)
        + [("chain", size, w, n) for w in (1, 2) for n in range(1, k + 1)]
    ]


def _forwards(size: int) -> list[tuple]:
    return [("forward", size, w, False) for w in range(1, MAX_STATIC_WIDTH + 1)]


def _buckets_up_to(batch: int) -> list[int]:
    top = _bucket(min(batch, GRAPH_BATCH_SIZES[-1]))
    return [s for s in reversed(GRAPH_BATCH_SIZES) if s <= top]


def _bucket(batch: int) -> int:
    return next(s for s in GRAPH_BATCH_SIZES if s >= batch)
