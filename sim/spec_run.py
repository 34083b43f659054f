"""Runs of spec iterations that keep each member's state in the run: the simulator's fast path
while a pod speculates.

A speculating pod drafts, verifies and commits every sequence of its batch every iteration;
doing that through the engine's objects (the scheduler's KV check per sequence, a length kept
as a range, the pause and acceptance methods, two passes over the batch) was most of a fleet's
time when it speculated all hour. A run keeps what a spec iteration reads and writes of its
members (their lengths, KV room, pauses, acceptance estimates, the draft's caches) in flat
arrays, one slot a member in the batch's order, and plans the next iteration in the pass that
commits this one. Flat: a 256-pod fleet's members, each an object of its own with its numbers
scattered over the heap, took three times as long a member as one pod's, the cache cold for
each pod's turn. The Sequence is written only when something else reads it:
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

from array import array
from bisect import bisect
from collections.abc import Callable
from typing import Generic, TypeVar

from spectune.engine.block_manager import BlockManager
from spectune.engine.draft_lag import STEADY_LAG, CatchUp, owed
from spectune.engine.sequence import ACCEPTANCE_KEPT, ACCEPTANCE_TAKEN, RETRY_ACCEPTANCE
from spectune.sim.plain_run import Member

M = TypeVar("M", bound=Member)


class SpecRun(Generic[M]):
    """The running batch through consecutive spec iterations of `k` drafted tokens (of a draft
    model with `draft`, else n-grams). Member i's Sequence fields while the run holds them:
    `length[i]`, `room[i]` (the tokens its KV blocks hold), `paused[i]`, `acceptance[i]`,
    `draft_cached[i]`; `k[i]`: what it drafts in the next iteration. The plan for that
    iteration: `drafting[k]` members draft k tokens, their lengths summing to `lengths[k]`;
    `fed_two` of the drafting members (their lengths summing to `fed_two_lengths`) feed the
    draft's proposal two tokens; `behind` (indices) lag past the steady state (a catch-up
    first); `needing` (indices) need KV blocks first."""

    def __init__(self, k: int, draft: bool, block_size: int) -> None:
        self.most, self.draft, self.block_size = k, draft, block_size
        self.members: list[M] = []
        self.rate = array("d")  # its request's chance to accept a drafted token
        self.final = array("q")
        self.length = array("q")
        self.room = array("q")
        self.acceptance = array("d")
        self.draft_cached = array("q")
        self.paused: list[int] = []  # small ints (shared objects): a list is quicker
        self.k: list[int] = []
        self.fresh = 0  # the last members, joined since the last iteration: their own last token
        self.unread: list[int] = []  # plain_unread to clear when they next draft
        self.last_end = 0.0  # when the last iteration ended: the members' last token but fresh
        self.drafting = [0] * (k + 1)
        self.lengths = [0] * (k + 1)
        self.fed_two = self.fed_two_lengths = 0
        self.behind: list[int] = []
        self.needing: list[int] = []

    def join(self, m: M, rate: float) -> None:
        """A running sequence whose fields are all written enters the run now."""
        seq, i = m.seq, len(self.members)
        length, final, paused, seen = len(seq), m.final, seq.paused_iterations, seq.draft_cached
        room = len(seq.block_table) * self.block_size
        self.members.append(m)
        self.rate.append(rate)
        self.final.append(final)
        self.length.append(length)
        self.room.append(room)
        self.acceptance.append(seq.acceptance)
        self.draft_cached.append(seen)
        self.paused.append(paused)
        self.fresh += 1
        if self.draft and seq.plain_unread:
            self.unread.append(i)
        k = 0 if paused else min(self.most, final - length - 1)
        self.k.append(k)
        self.drafting[k] += 1
        self.lengths[k] += length
        if k and self.draft:
            lag = length - seen
            if lag > STEADY_LAG:
                self.behind.append(i)
            elif lag == 2:
                self.fed_two += 1
                self.fed_two_lengths += length
        if length + self.most > room:
            self.needing.append(i)

    def reserve(self, blocks: BlockManager) -> bool:
        """Give the members that need it room for their next token and k drafted ones, in the
        batch's order as the scheduler does; False at the first whose blocks are short (the
        scheduler preempts then, and finds those before it with the room given here)."""
        most, size = self.most, self.block_size
        for i in self.needing:
            seq = self.members[i].seq
            if not blocks.reserve(seq, self.length[i] + most):
                return False
            self.room[i] = len(seq.block_table) * size
        self.needing = []
        return True

    def proposal(self) -> tuple[int, int, int]:
        """The draft proposal's positions, cached and attended tokens, summed over the
        drafting members: each fed one token after length - 1 cached, or two after length - 2."""
        count = sum(self.drafting) - self.drafting[0]
        total = sum(self.lengths) - self.lengths[0]
        fed = count + self.fed_two
        return fed, total - fed, total + self.fed_two_lengths - count - 2 * self.fed_two

    def catch_up(self) -> tuple[CatchUp, tuple[int, int, int]]:
        """The draft's catch-up of the lagging members, as engine/draft_lag.py's catch_up
        books it, and its one forward's positions, cached and attended tokens: it feeds each
        its tokens after `draft_cached` but the newest. Their draft cache moves when they
        commit."""
        positions = cached = attended = owing = 0
        for i in self.behind:
            length, seen = self.length[i], self.draft_cached[i]
            fed = length - 1 - seen
            positions += fed
            cached += seen
            attended += fed * seen + fed * (fed - 1) // 2
            owing += owed(length, seen, self.members[i].seq.plain_unread)
        return CatchUp(owing, positions - owing), (positions, cached, attended)

    def commit(
        self, at: float, draw: Callable[[], float], floor: float, pause: int
    ) -> tuple[list[M], int, int, float]:
        """The iteration ends at `at`: draw each drafting member's acceptances (below its
        rate, as the engine's sampler accepts a drafted token), commit the accepted tokens
        and one more, track acceptance as Sequence.record_acceptance does, and plan the next
        iteration. Returns the members that got their last token (written, in the batch's
        order), the tokens committed, the drafted tokens accepted and the inter-token gaps
        summed in the batch's order (as the engine adds them)."""
        lengths_now, finals, ks, pauses = self.length, self.final, self.k, self.paused
        if self.unread:
            for i in self.unread:
                if ks[i]:
                    self.members[i].seq.plain_unread = 0
            self.unread = [i for i in self.unread if not ks[i] and finals[i] - lengths_now[i] > 1]
        most, draft = self.most, self.draft
        acceptances, seens = self.acceptance, self.draft_cached
        kept, taken, retry = ACCEPTANCE_KEPT, ACCEPTANCE_TAKEN, RETRY_ACCEPTANCE
        drafting, lengths = [0] * (most + 1), [0] * (most + 1)
        fed_two = fed_two_lengths = committed = accepted = 0
        behind: list[int] = []
        needing: list[int] = []
        done: list[int] = []
        n = len(ks)
        lasts = [self.last_end] * (n - self.fresh)
        for m in self.members[n - self.fresh :]:
            assert m.request.last_token_at is not None  # its prefill's token, at least
            lasts.append(m.request.last_token_at)
        gaps = 0.0
        i = -1
        for k, length, rate, final, room, estimate, last in zip(
            ks, lengths_now, self.rate, finals, self.room, acceptances, lasts, strict=True
        ):
            i += 1
            gaps += at - last
            if k:
                acc = 0
                while acc < k and draw() < rate:
                    acc += 1
                accepted += acc
                acceptance = kept * estimate + taken * (acc / k)  # as Sequence.record_acceptance
                paused = 0
                if acceptance < floor:
                    pauses[i] = paused = pause
                    acceptance = retry
                acceptances[i] = acceptance
                if acc < k:  # the draft has seen all but the last of what it drafted
                    lag = 1
                    seen = length + acc
                else:
                    lag = 2
                    seen = length + k - 1
                if draft:
                    seens[i] = seen
                end = length + acc + 1  # at most final: k left room for one more
            else:
                paused = pauses[i]
                if paused:
                    pauses[i] = paused = paused - 1
                end = length + 1
                lag = end - seens[i]
            committed += end - length
            lengths_now[i] = end
            if end == final:
                done.append(i)
                continue
            # the next iteration, as the engine's first pass would find it
            if paused:
                k = 0
            else:
                k = final - end - 1
                if k > most:
                    k = most
            ks[i] = k
            drafting[k] += 1
            lengths[k] += end
            if k and draft:
                if lag > STEADY_LAG:
                    behind.append(i)
                elif lag == 2:
                    fed_two += 1
                    fed_two_lengths += end
            if end + most > room:
                needing.append(i)
        self.drafting, self.lengths = drafting, lengths
        self.fed_two, self.fed_two_lengths = fed_two, fed_two_lengths
        self.last_end, self.fresh = at, 0
        self.behind, self.needing = behind, needing
        finished = [self._write(i) for i in done]
        for m in finished:
            m.request.last_token_at = at
        if done:
            self._remove(done)
        return finished, committed, accepted, gaps

    def dissolve(self) -> None:
        """Write every member's fields, the last token of those that ran streamed when the
        run's last iteration ended."""
        ran = len(self.members) - self.fresh
        for i in range(len(self.members)):
            m = self._write(i)
            if i < ran:
                m.request.last_token_at = self.last_end

    def _write(self, i: int) -> M:
        m = self.members[i]
        seq = m.seq
        seq.token_ids = range(self.length[i])
        seq.paused_iterations = self.paused[i]
        seq.acceptance = self.acceptance[i]
        seq.draft_cached = self.draft_cached[i]
        return m

    def _remove(self, done: list[int]) -> None:
        """Drop the finished members (`done`, ascending) from every array, and move the later
        members' indices in the plan down to match."""
        for i in reversed(done):
            for column in (
                self.members, self.rate, self.final, self.length, self.room,
                self.acceptance, self.draft_cached, self.paused, self.k,
            ):  # fmt: skip
                del column[i]
        for plan in (self.behind, self.needing, self.unread):
            if plan:
                plan[:] = [i - bisect(done, i) for i in plan]
