"""Everything on the device: the model, its paged KV cache, batch tensors, CUDA graphs.

Sequences never reach the model: a `Feed` says which tokens to run from which position
into which blocks, and the runner turns a list of feeds into padded tensors. On CUDA,
single-token decode batches replay a CUDA graph captured lazily per padded batch size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from spectune.engine.block_manager import blocks_for
from spectune.engine.model import PagedBatch, Transformer

GRAPH_BATCH_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


@dataclass(frozen=True)
class Feed:
    tokens: list[int]
    start: int  # absolute position of tokens[0]
    block_table: list[int]


def paged_batch(
    positions: Tensor, slot_mapping: Tensor, block_tables: Tensor, block_size: int
) -> PagedBatch:
    """The attention mask from block tables; pure tensor ops so a CUDA graph can capture it."""
    key_pos = torch.arange(block_tables.shape[1] * block_size, device=block_tables.device)
    mask = (key_pos.view(1, 1, -1) <= positions.unsqueeze(-1)).unsqueeze(1)  # [B, 1, L, S]
    return PagedBatch(slot_mapping, block_tables, block_size, mask)


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


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: dict[str, Tensor]
    logits: Tensor


class ModelRunner:
    def __init__(
        self,
        model: Transformer,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        cuda_graphs: bool,
    ) -> None:
        self.model = model
        if model.embed_tokens.weight.device.type == "cpu":
            _column_major_linears(model)
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
        self.use_graphs = cuda_graphs and self.device.type == "cuda"
        self._graphs: dict[int, _Graph] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self.on_forward: Callable[[list[Feed]], None] | None = None  # a simulated device's meter

    @torch.inference_mode()
    def forward(self, feeds: list[Feed], all_logits: bool) -> Tensor:
        """Logits [B, M, V] in float32: at every fed position, or at each feed's last one."""
        longest = max(len(f.tokens) for f in feeds)
        if self.use_graphs and longest == 1 and len(feeds) <= GRAPH_BATCH_SIZES[-1]:
            logits = self._replay(feeds)
        else:
            ids, pos, slots, tables = self._prepare(feeds, longest)
            index = None
            if not all_logits:
                last = [len(f.tokens) - 1 for f in feeds]
                index = torch.tensor(last, device=self.device).unsqueeze(1)
            logits = self._run(ids, pos, slots, tables, index)
        if self.on_forward is not None:
            self.on_forward(feeds)
        return logits

    def _run(
        self, ids: Tensor, pos: Tensor, slots: Tensor, tables: Tensor, index: Tensor | None
    ) -> Tensor:
        paged = paged_batch(pos, slots, tables, self.block_size)
        return self.model(ids, pos, self.caches, paged, index)

    def _prepare(self, feeds: list[Feed], longest: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
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
        return tuple(
            torch.tensor(x, dtype=torch.long, device=self.device) for x in (ids, pos, slots, tables)
        )

    def _replay(self, feeds: list[Feed]) -> Tensor:
        size = next(s for s in GRAPH_BATCH_SIZES if s >= len(feeds))
        g = self._graphs.get(size) or self._capture(size)
        ids, pos, slots, tables = self._prepare(feeds, 1)
        b, w = tables.shape
        for name, src in (("ids", ids), ("pos", pos), ("slots", slots)):
            g.inputs[name].zero_()
            g.inputs[name][:b].copy_(src)
        g.inputs["tables"].zero_()
        g.inputs["tables"][:b, :w].copy_(tables)
        g.graph.replay()
        return g.logits[:b]

    def _capture(self, size: int) -> _Graph:
        """Capture one padded decode batch size; pads write only to scratch slot 0."""
        zeros = dict(dtype=torch.long, device=self.device)
        inputs = {
            "ids": torch.zeros(size, 1, **zeros),
            "pos": torch.zeros(size, 1, **zeros),
            "slots": torch.zeros(size, 1, **zeros),
            "tables": torch.zeros(size, self.max_blocks, **zeros),
            # Every tensor the graph reads must outlive it: a freed one's memory is reused,
            # and replays would read whatever lands there (seen on an H200: gather indices
            # out of bounds). The last position of a one-token feed is always 0.
            "index": torch.zeros(size, 1, **zeros),
        }
        args = tuple(inputs[name] for name in ("ids", "pos", "slots", "tables", "index"))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._run(*args)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self._run(*args)
        self._graphs[size] = _Graph(graph, inputs, logits)
        return self._graphs[size]
