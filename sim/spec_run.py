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
A member that drafts nothing (paused for poor acceptance, or at its last token) is idle: it
gets one token an iteration, so the run steps it only when that changes (it drafts again,
finishes or needs a KV block) and counts it in bulk between. On the busy fleets of
benchmarks/sim_speed.py seven members in ten are paused at any iteration.
Acceptances are drawn in the engine's order (the batch's, then each member's drafted tokens),
so a run gives the engine's results exactly, but for the inter-token gaps of the members that
ran the last iteration, summed as a product (as sim/plain_run.py does) where the engine adds
them one by one. The draft's proposal feeds a member one token
(it saw all but the newest, or was caught up to that) or two (it accepted every draft), so
the proposal's sums are kept as the count and lengths of the members fed two.

SimEngine(per_iteration=True) runs every spec iteration the engine's way; the tests hold the
two to the same results.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Generic, TypeVar

from spectune.engine.block_manager import BlockManager
from spectune.engine.draft_lag import STEADY_LAG, CatchUp, owed
from spectune.engine.sequence import ACCEPTANCE_KEPT, ACCEPTANCE_TAKEN, RETRY_OVER_FLOOR
from spectune.sim.plain_run import Member

M = TypeVar("M", bound=Member)


class SpecRun(Generic[M]):
    """The running batch through consecutive spec iterations of `k` drafted tokens (of a draft
    model with `draft`, else n-grams); `count` have run, the one about to run is number `count`.
    Member i (its slot: members keep theirs, in the batch's order, a finished one leaving None)
    has its Sequence's fields in `length[i]`, `room[i]` (the tokens its KV blocks hold),
    `paused[i]`, `acceptance[i]`, `draft_cached[i]`; `k[i]`: what it drafts in the next
    iteration. A member that drafts nothing is idle: its length and pause stand as they were at
    the start of iteration `since[i]` (-1 for the others), and it is next visited at the
    iteration `_wakes` files it under. The plan for the next iteration: `drafting[k]` members
    draft k tokens, their lengths summing to `lengths[k]`; `visit` (slots, ascending) are those
    the next commit steps one by one; `fed_two` of the drafting members (their lengths summing
    to `fed_two_lengths`) feed the draft's proposal two tokens; `behind` (slots) lag past the
    steady state (a catch-up first); `needing` (slots, ascending) need KV blocks first."""

    def __init__(self, k: int, draft: bool, block_size: int) -> None:
        self.most, self.draft, self.block_size = k, draft, block_size
        self.count = 0
        self.size = 0  # members in the batch
        self.members: list[M | None] = []
        self.rate = array("d")  # its request's chance to accept a drafted token
        self.final = array("q")
        self.length = array("q")
        self.room = array("q")
        self.acceptance = array("d")
        self.draft_cached = array("q")
        self.since = array("q")
        self.paused: list[int] = []  # small ints (shared objects): a list is quicker
        self.k: list[int] = []
        self.fresh = 0  # the last members, joined since the last iteration: their own last token
        self.unread: list[int] = []  # plain_unread to clear when they next draft
        self.last_end = 0.0  # when the last iteration ended: the members' last token but fresh
        self.drafting = [0] * (k + 1)
        self.lengths = [0] * (k + 1)
        self.visit: list[int] = []
        self.fed_two = self.fed_two_lengths = 0
        self.behind: list[int] = []
        self.needing: list[int] = []
        self.idle = self.idle_lengths = 0  # idle members not visited next, and their lengths
        self._wakes: dict[int, list[int]] = {}

    def join(self, m: M, rate: float) -> None:
        """A running sequence whose fields are all written enters the run now."""
        seq, i = m.seq, len(self.members)
        length, final, paused, seen = len(seq), m.final, seq.paused_iterations, seq.draft_cached
        room = len(seq.block_table) * self.block_size
        self.members.append(m)
        self.size += 1
        self.rate.append(rate)
        self.final.append(final)
        self.length.append(length)
        self.room.append(room)
        self.acceptance.append(seq.acceptance)
        self.draft_cached.append(seen)
        self.since.append(-1)
        self.paused.append(paused)
        self.fresh += 1
        self.visit.append(i)
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
            m = self.members[i]
            assert m is not None
            if not blocks.reserve(m.seq, self.length[i] + most):
                return False
            self.room[i] = len(m.seq.block_table) * size
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
            m = self.members[i]
            assert m is not None
            length, seen = self.length[i], self.draft_cached[i]
            fed = length - 1 - seen
            positions += fed
            cached += seen
            attended += fed * seen + fed * (fed - 1) // 2
            owing += owed(length, seen, m.seq.plain_unread)
        return CatchUp(owing, positions - owing), (positions, cached, attended)

    def commit(
        self, at: float, draw: Callable[[], float], floor: float, pause: int
    ) -> tuple[list[M], int, int, float]:
        """The iteration ends at `at`: every idle member not visited gets a token; each visited
        member drafting draws its acceptances (below its rate, as the engine's sampler accepts a
        drafted token), commits the accepted tokens and one more and tracks acceptance as
        Sequence.record_acceptance does; and the next iteration is planned. Returns the members
        that got their last token (written, in the batch's order), the tokens committed, the
        drafted tokens accepted and the inter-token gaps summed (those that ran the last
        iteration as a product, as sim/plain_run.py's are)."""
        count, lengths_now, finals, ks = self.count, self.length, self.final, self.k
        if self.unread:
            for i in self.unread:
                if ks[i]:
                    self.members[i].seq.plain_unread = 0  # type: ignore[union-attr]
            # those that will still draft: not about to finish (an idle one grew meanwhile)
            left = [finals[i] - lengths_now[i] - self._idle_for(i) for i in self.unread]
            self.unread = [i for i, n in zip(self.unread, left, strict=True) if not ks[i] and n > 1]
        most, draft = self.most, self.draft
        rates, rooms, since, pauses = self.rate, self.room, self.since, self.paused
        acceptances, seens, wakes = self.acceptance, self.draft_cached, self._wakes
        kept, taken, retry = ACCEPTANCE_KEPT, ACCEPTANCE_TAKEN, RETRY_OVER_FLOOR * floor
        drafting, lengths = [0] * (most + 1), [0] * (most + 1)
        fed_two = fed_two_lengths = accepted = 0
        committed, idle = self.idle, self.idle
        idle_lengths = self.idle_lengths + idle
        visit: list[int] = []
        behind: list[int] = []
        needing: list[int] = []
        done: list[int] = []
        for i in self.visit:
            k, length, final = ks[i], lengths_now[i], finals[i]
            if k:
                rate = rates[i]
                acc = 0
                while acc < k and draw() < rate:
                    acc += 1
                accepted += acc
                acceptance = kept * acceptances[i] + taken * (acc / k)  # as record_acceptance
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
            if not k:  # idle: next visited when it drafts again, finishes or needs a block
                wake = final - end
                if paused and paused < wake:
                    wake = paused
                grows = rooms[i] - most - end + 2
                if grows < wake:
                    wake = grows if grows > 1 else 1
                wakes.setdefault(count + wake, []).append(i)
                since[i] = count + 1
                idle += 1
                idle_lengths += end
                continue
            visit.append(i)
            drafting[k] += 1
            lengths[k] += end
            if draft:
                if lag > STEADY_LAG:
                    behind.append(i)
                elif lag == 2:
                    fed_two += 1
                    fed_two_lengths += end
            if end + most > rooms[i]:
                needing.append(i)
        drafting[0], lengths[0] = idle, idle_lengths
        woken = wakes.pop(count + 1, None)
        if woken:
            woken.sort()
            for i in woken:  # idle since since[i], a token an iteration through this one
                behind_by = count + 1 - since[i]
                length = lengths_now[i] = lengths_now[i] + behind_by
                pauses[i] -= behind_by
                since[i] = -1
                idle -= 1
                idle_lengths -= length
                if length + most > rooms[i]:
                    needing.append(i)
            visit = sorted(visit + woken)
            needing.sort()
        gaps = (self.size - self.fresh) * (at - self.last_end)
        for m in self.members[len(self.members) - self.fresh :]:
            assert m is not None and m.request.last_token_at is not None  # its prefill's token
            gaps += at - m.request.last_token_at
        self.count = count + 1
        self.drafting, self.lengths, self.visit = drafting, lengths, visit
        self.idle, self.idle_lengths = idle, idle_lengths
        self.fed_two, self.fed_two_lengths = fed_two, fed_two_lengths
        self.last_end, self.fresh = at, 0
        self.behind, self.needing = behind, needing
        finished = [self._write(i) for i in done]
        for m in finished:
            m.request.last_token_at = at
        self.size -= len(done)
        for i in done:
            self.members[i] = None
        if len(self.members) > 2 * self.size + 8:
            self._compact()
        return finished, committed, accepted, gaps

    def dissolve(self) -> None:
        """Write every member's fields, the last token of those that ran streamed when the
        run's last iteration ended."""
        ran = len(self.members) - self.fresh
        for i, m in enumerate(self.members):
            if m is not None:
                self._write(i)
                if i < ran:
                    m.request.last_token_at = self.last_end

    def _idle_for(self, i: int) -> int:
        """The iterations member i has been idle through, a token and a pause step each, that
        its length and pause do not show yet (0 for a member the run steps)."""
        since = self.since[i]
        return self.count - since if since >= 0 else 0

    def _write(self, i: int) -> M:
        m = self.members[i]
        assert m is not None
        seq, idle_for = m.seq, self._idle_for(i)
        seq.token_ids = range(self.length[i] + idle_for)
        seq.paused_iterations = self.paused[i] - idle_for
        seq.acceptance = self.acceptance[i]
        seq.draft_cached = self.draft_cached[i]
        return m

    def _compact(self) -> None:
        """Drop the finished members' slots (more than half of them), and move every slot
        kept in the plan and the wakes to its new number."""
        kept = [i for i, m in enumerate(self.members) if m is not None]
        moved = {old: new for new, old in enumerate(kept)}
        self.members = [self.members[i] for i in kept]
        self.paused = [self.paused[i] for i in kept]
        self.k = [self.k[i] for i in kept]
        for name in ("rate", "final", "length", "room", "acceptance", "draft_cached", "since"):
            column: array = getattr(self, name)
            setattr(self, name, array(column.typecode, [column[i] for i in kept]))
        for plan in (self.visit, self.behind, self.needing, self.unread):
            plan[:] = [moved[i] for i in plan]
        self._wakes = {at: [moved[i] for i in slots] for at, slots in self._wakes.items()}
