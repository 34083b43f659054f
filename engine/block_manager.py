"""Paged KV blocks: a free list and per-sequence block tables.

Block 0 is a scratch block no sequence owns: padded query rows write there. A block id
indexes the target's cache and, with a draft model, the draft's cache of the same
shape, so one allocation pays both KV bills.
"""

from __future__ import annotations

from spectune.engine.sequence import Sequence


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"the KV budget holds {num_blocks} blocks; at least 2 are needed")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, 0, -1))  # pop() hands out low ids first

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def usable_blocks(self) -> int:
        return self.num_blocks - 1

    def reserve(self, seq: Sequence, capacity: int) -> bool:
        """Grow seq's table to hold `capacity` token positions; False (and no change) if short."""
        if len(seq.block_table) * self.block_size >= capacity:  # most decode steps: the last
            return True  # block has room
        need = blocks_for(capacity, self.block_size) - len(seq.block_table)
        if need > len(self._free):
            return False
        if need == 1:  # a decode step's: most calls
            seq.block_table.append(self._free.pop())
            return True
        # the blocks pop() would hand out one by one, in one slice (a prefill takes dozens)
        seq.block_table.extend(reversed(self._free[-need:]))
        del self._free[-need:]
        return True

    def free(self, seq: Sequence) -> None:
        self._free.extend(reversed(seq.block_table))
        seq.block_table = []
        seq.draft_cached = 0


def plan_blocks(
    budget_bytes: int, block_size: int, bytes_per_token: list[int], max_model_len: int
) -> tuple[int, int]:
    """Blocks that fit the KV budget, and the admitted concurrency: how many sequences of
    the full context length fit at once. Every model in `bytes_per_token` (target, draft)
    pays its KV per block, so a draft lowers both by its share."""
    per_block = block_size * sum(bytes_per_token)
    num_blocks = budget_bytes // per_block
    admitted = (num_blocks - 1) // blocks_for(max_model_len, block_size)
    return num_blocks, admitted
