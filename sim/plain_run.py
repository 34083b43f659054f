"""Runs of plain iterations whose cost does not grow with the batch: the simulator's fast path.

A busy pod runs a hundred sequences or more, and a plain iteration gives each of them one token:
writing every one of them every iteration was four fifths of a fleet run's time. Within a run of
plain iterations a sequence's length is the length it had when last written plus the iterations
since, so it is written only when something reads it:
- a new KV block, every block_size tokens: the iteration it needs one is known when it joins;
- its last token: it asks for a fixed number, so the iteration it finishes is known too;
- any other kind of iteration (a spec iteration reads every length, a preemption frees by them),
  before which the run ends (SimEngine._dissolve writes every member).
Every member's last token came at the end of the run's last iteration, but for those that joined
since (a prefill, the run's start), which keep their own time.

SimEngine(per_iteration=True) writes every sequence every iteration, as the engine does; the
tests hold the two to the same metrics.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from spectune.engine.sequence import Sequence


class Streamed(Protocol):
    """A request as a run reads it: when its client got its last token."""

    last_token_at: float | None


@dataclass(eq=False, slots=True)
class Member:
    """A running sequence in a run, and the request it serves (sim/engine_pod.py's Tracked)."""

    request: Streamed
    seq: Sequence
    synced: int = 0  # the run's count when its tokens were last written
    rank: int = 0  # its place in the running batch: members finish in the engine's order
    end: int = 0  # the run's iteration that gives it its last token
    # its length with its last token (the simulator asks for no more than the context holds)
    final: int = field(init=False)

    def __post_init__(self) -> None:
        self.final = self.seq.prompt_len + self.seq.params.max_tokens


M = TypeVar("M", bound=Member)


class PlainRun(Generic[M]):
    """The running batch through consecutive plain iterations. `count` iterations have run;
    the iteration about to run is number `count`. Members come back as they joined (the
    engine's Tracked)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.count = 0
        self.tokens = 0  # the members' lengths, summed: what the next iteration's forward reads
        self.last_end = 0.0  # when the last iteration ended: the members' last token but fresh
        self.fresh: list[M] = []  # joined since that iteration, each with its own last token
        self._needs: dict[int, list[M]] = defaultdict(list)  # iteration -> a block each
        self._ends: dict[int, list[M]] = defaultdict(list)  # iteration -> their last token
        self._ranks = itertools.count()

    def join(self, m: M) -> None:
        """A running sequence whose tokens are all written enters the run now."""
        seq = m.seq
        m.synced, m.rank = self.count, next(self._ranks)
        m.end = self.count + m.final - len(seq) - 1
        self.tokens += len(seq)
        self.fresh.append(m)
        self._ends[m.end].append(m)
        self._plan_block(m)

    def needing_blocks(self) -> list[M]:
        """The members whose length outgrows their KV blocks in this iteration, by one block
        each (a member grows by one token an iteration)."""
        return self._needs.pop(self.count, [])

    def length(self, m: Member) -> int:
        """`m`'s tokens now, written or not."""
        return len(m.seq) + self.count - m.synced

    def reserved(self, m: M) -> None:
        """`m` got its block: plan its next one."""
        self._plan_block(m)

    def sync(self, m: Member) -> None:
        """Write the tokens the run has given `m` since it was last written, the last of them
        streamed when the run's last iteration ended."""
        behind = self.count - m.synced
        if behind:
            seq = m.seq
            seq.token_ids = range(len(seq.token_ids) + behind)
            seq.plain_unread += behind
            m.synced = self.count
            m.request.last_token_at = self.last_end

    def advance(self, end: float, batch: int) -> list[M]:
        """The iteration ends at `end`, `batch` members got a token each: the members that got
        their last one (written, in the running batch's order)."""
        done = self._ends.pop(self.count, [])
        self.count += 1
        self.tokens += batch
        self.last_end = end
        self.fresh = []
        for m in done:
            self.sync(m)
            self.tokens -= len(m.seq)
        return sorted(done, key=lambda m: m.rank) if len(done) > 1 else done

    def _plan_block(self, m: M) -> None:
        """The first iteration whose length outgrows `m`'s blocks, unless it finishes first."""
        seq = m.seq
        need = m.synced + len(seq.block_table) * self.block_size - len(seq) + 1
        if need <= m.end:
            self._needs[need].append(m)
