"""Continuous batching: who runs this iteration, and who is preempted when KV runs out.

Prefill comes first (new requests join between iterations); otherwise every running
sequence decodes. When a decode cannot get the blocks it needs, the most recently
admitted sequence is preempted: its blocks are freed and it goes back to the front of
the queue, to be recomputed from its tokens later, so nothing is lost and greedy
output does not change.
"""

from __future__ import annotations

from collections import deque

from spectune.engine.block_manager import BlockManager
from spectune.engine.sequence import Sequence, Status


class Scheduler:
    def __init__(self, blocks: BlockManager, max_batch_size: int, max_prefill_tokens: int) -> None:
        self.blocks = blocks
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @staticmethod
    def prefill_len(seq: Sequence) -> int:
        """Tokens a prefill feeds: the prompt, or all but the last token of a resumed seq."""
        return len(seq) - 1 if seq.is_resumed else len(seq)

    def schedule_prefill(self) -> list[Sequence]:
        """Admit waiting sequences in order while batch, token and KV budgets allow."""
        batch: list[Sequence] = []
        longest = 0
        while self.waiting and len(self.running) < self.max_batch_size:
            seq = self.waiting[0]
            n = self.prefill_len(seq)
            padded = max(longest, n) * (len(batch) + 1)
            if batch and padded > self.max_prefill_tokens:
                break
            if not self.blocks.reserve(seq, n + 1):
                break
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            batch.append(seq)
            longest = max(longest, n)
        return batch

    def schedule_decode(self, lookahead: int) -> list[Sequence]:
        """Give every running seq room for its next token plus `lookahead` drafted ones."""
        scheduled: list[Sequence] = []
        reserve, size = self.blocks.reserve, self.blocks.block_size
        for seq in list(self.running):
            if seq.status is not Status.RUNNING:
                continue  # preempted earlier in this loop
            if len(seq.block_table) * size >= len(seq.token_ids) + lookahead:
                scheduled.append(seq)  # most steps: room in its last block (no call, as the
                continue  # fleet simulator runs this for every sequence of every pod)
            while not reserve(seq, len(seq.token_ids) + lookahead):
                victim = self.running[-1]
                self.preempt(victim)
                if victim is seq:
                    break
            else:
                scheduled.append(seq)
        return scheduled

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def abort(self, seq: Sequence) -> None:
        if seq.status is Status.WAITING:
            self.waiting.remove(seq)
        elif seq.status is Status.RUNNING:
            self.finish(seq, "abort")

    def finish(self, seq: Sequence, reason: str) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = reason
