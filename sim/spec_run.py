"""Runs of spec iterations that keep each member's state in the run: the simulator's fast path
while a pod speculates.

A speculating pod drafts, verifies and commits every sequence of its batch every iteration;
doing that through the engine's objects (the scheduler's KV check per sequence, a length kept
as a range, the pause and acceptance methods, two passes over the batch) was most of a fleet's
time when it speculated all hour. A run keeps what a spec iteration reads and writes of each
member (its length, KV room, pause, acceptance estimate, the draft's cache) on a record of its
own, and plans the next iteration in the pass that commits this one. The Sequence is written
only when something else reads it:
- a draft catch-up (engine/draft_lag.py reads the sequence);
- its last token (it leaves the batch);
- any other kind of iteration, or one that preempts, before which the run ends
  (SimEngine._dissolve writes every member).
Acceptances are drawn in the engine's order (the batch's, then each member's drafted tokens),
so a run gives the engine's results exactly. The draft's proposal feeds a member one token
(it saw all but the newest, or was caught up to that) or two (it accepted every draft), so
the proposal's sums are kept as the count and lengths of the members fed two.

SimEngine(per_iteration=True) runs every spec iteration the engine's way; the tests hold the
two to the same results.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from spectune.engine.block_manager import BlockManager, blocks_for
from spectune.engine.draft_lag import STEADY_LAG
from spectune.engine.sequence import Sequence
from spectune.sim.plain_run import Member

M = TypeVar("M", bound=Member)


@dataclass(eq=False, slots=True)
class State(Generic[M]):
    """What a spec iteration reads and writes of one member, the Sequence's fields while the
    run holds them, and `k`: what it drafts in the next iteration."""

    member: M
    seq: Sequence
    final: int
    rate: float  # its request's chance to accept a drafted token
    length: int
    room: int  # the tokens its KV blocks hold
    paused: int
    acceptance: float
    draft_cached: int
    k: int = 0


class SpecRun(Generic[M]):
    """The running batch through consecutive spec iterations of `k` drafted tokens (of a draft
    model with `draft`, else n-grams). The plan for the next iteration: `drafting[k]` members
    draft k tokens, their lengths summing to `lengths[k]`; `fed_two` of the drafting members
    (their lengths summing to `fed_two_lengths`) feed the draft's proposal two tokens; `behind`
    lag past the steady state (a catch-up first); `needing` need KV blocks first."""

    def __init__(self, k: int, draft: bool, block_size: int) -> None:
        self.most, self.draft, self.block_size = k, draft, block_size
        self.members: list[State[M]] = []
        self.fresh: list[State[M]] = []  # joined since the last iteration: their own last token
        self.unread: list[State[M]] = []  # plain_unread to clear when they next draft
        self.last_end = 0.0  # when the last iteration ended: the members' last token but fresh
        self.drafting = [0] * (k + 1)
        self.lengths = [0] * (k + 1)
        self.fed_two = self.fed_two_lengths = 0
        self.behind: list[State[M]] = []
        self.needing: list[State[M]] = []

    def join(self, m: M, rate: float) -> None:
        """A running sequence whose fields are all written enters the run now."""
        seq = m.seq
        s = State(
            m,
            seq,
            m.final,
            rate,
            len(seq),
            len(seq.block_table) * self.block_size,
            seq.paused_iterations,
            seq.acceptance,
            seq.draft_cached,
        )
        self.members.append(s)
        self.fresh.append(s)
        if self.draft and seq.plain_unread:
            self.unread.append(s)
        k = 0 if s.paused else min(self.most, s.final - s.length - 1)
        s.k = k
        self.drafting[k] += 1
        self.lengths[k] += s.length
        if k and self.draft:
            lag = s.length - s.draft_cached
            if lag > STEADY_LAG:
                self.behind.append(s)
            elif lag == 2:
                self.fed_two += 1
                self.fed_two_lengths += s.length
        if s.length + self.most > s.room:
            self.needing.append(s)

    def reserve(self, blocks: BlockManager) -> bool:
        """Give the members that need it room for their next token and k drafted ones, in the
        batch's order as the scheduler does; False (and nothing reserved) when the free blocks
        are short (the scheduler preempts then)."""
        most, size = self.most, self.block_size
        need = sum(blocks_for(s.length + most, size) - len(s.seq.block_table) for s in self.needing)
        if need > blocks.num_free:
            return False
        for s in self.needing:
            blocks.reserve(s.seq, s.length + most)
            s.room = len(s.seq.block_table) * size
        self.needing = []
        return True

    def proposal(self) -> tuple[int, int, int]:
        """The draft proposal's positions, cached and attended tokens, summed over the
        drafting members: each fed one token after length - 1 cached, or two after length - 2."""
        count = sum(self.drafting) - self.drafting[0]
        total = sum(self.lengths) - self.lengths[0]
        fed = count + self.fed_two
        return fed, total - fed, total + self.fed_two_lengths - count - 2 * self.fed_two

    def caught_up(self) -> list[Sequence]:
        """The lagging members' sequences, their length and draft cache written for the
        catch-up to read (and move on)."""
        seqs = []
        for s in self.behind:
            seq = s.seq
            seq.token_ids = range(s.length)
            seq.draft_cached = s.draft_cached
            seqs.append(seq)
        return seqs

    def commit(
        self, at: float, draw: Callable[[], float], floor: float, pause: int
    ) -> tuple[list[M], int, int, float]:
        """The iteration ends at `at`: draw each drafting member's acceptances (below its
        rate, as the engine's sampler accepts a drafted token), commit the accepted tokens
        and one more, track acceptance as Sequence.record_acceptance does, and plan the next
        iteration. Returns the members that got their last token (written, in the batch's
        order), the tokens committed, the drafted tokens accepted and the inter-token gaps
        summed in the batch's order (as the engine adds them)."""
        if self.unread:
            for s in self.unread:
                if s.k:
                    s.seq.plain_unread = 0
            self.unread = [s for s in self.unread if not s.k and s.final - s.length > 1]
        members, most, draft = self.members, self.most, self.draft
        drafting, lengths = [0] * (most + 1), [0] * (most + 1)
        fed_two = fed_two_lengths = committed = accepted = 0
        behind: list[State[M]] = []
        needing: list[State[M]] = []
        done: list[State[M]] = []
        lasts = [self.last_end] * (len(members) - len(self.fresh))
        for s in self.fresh:
            assert s.member.request.last_token_at is not None  # its prefill's token, at least
            lasts.append(s.member.request.last_token_at)
        gaps = 0.0
        for s, last in zip(members, lasts, strict=True):
            gaps += at - last
            k, length = s.k, s.length
            if k:
                acc = 0
                rate = s.rate
                while acc < k and draw() < rate:
                    acc += 1
                accepted += acc
                acceptance = 0.7 * s.acceptance + 0.3 * (acc / k)
                if acceptance < floor:
                    s.paused = pause
                    acceptance = 0.5
                s.acceptance = acceptance
                if draft:  # it has seen all but the last of what it drafted
                    s.draft_cached = length + acc if acc < k else length + k - 1
                end = length + acc + 1  # at most final: k left room for one more
            else:
                if s.paused:
                    s.paused -= 1
                end = length + 1
            committed += end - length
            s.length = end
            if end == s.final:
                done.append(s)
                continue
            # the next iteration, as the engine's first pass would find it
            if s.paused:
                k = 0
            else:
                k = s.final - end - 1
                if k > most:
                    k = most
            s.k = k
            drafting[k] += 1
            lengths[k] += end
            if k and draft:
                lag = end - s.draft_cached
                if lag > STEADY_LAG:
                    behind.append(s)
                elif lag == 2:
                    fed_two += 1
                    fed_two_lengths += end
            if end + most > s.room:
                needing.append(s)
        self.drafting, self.lengths = drafting, lengths
        self.fed_two, self.fed_two_lengths = fed_two, fed_two_lengths
        self.behind, self.needing = behind, needing
        self.last_end = at
        self.fresh = []
        for s in done:
            members.remove(s)
            self._write(s)
            s.member.request.last_token_at = at
        return [s.member for s in done], committed, accepted, gaps

    def dissolve(self) -> None:
        """Write every member's fields, the last token of those that ran streamed when the
        run's last iteration ended."""
        ran = len(self.members) - len(self.fresh)
        for i, s in enumerate(self.members):
            self._write(s)
            if i < ran:
                s.member.request.last_token_at = self.last_end

    @staticmethod
    def _write(s: State[M]) -> None:
        seq = s.seq
        seq.token_ids = range(s.length)
        seq.paused_iterations = s.paused
        seq.acceptance = s.acceptance
        seq.draft_cached = s.draft_cached
