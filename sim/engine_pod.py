"""One simulated engine pod: the engine's own Scheduler, BlockManager and gate, its forwards
charged to a simulated SKU's clock (engine/simulated_device.py, as `--simulate-device` does),
and drafted tokens accepted at each request's drawn rate instead of by a model.

An iteration is what `LLMEngine._step` runs: a prefill when a waiting request fits, else one
decode iteration in the mode the gate picks. A spec iteration charges the same forwards the
engine runs: the draft's catch-up (draft_lag), its first forward over the tokens it has not
seen, one forward per further drafted token, and the target's verify over 1 + k positions per
sequence. The metric contract's series are kept as plain counters (metric, labels) -> value,
what a scrape reads.

A sequence's tokens are a `range` of its length: the simulator reads only lengths, and a list
of zeros per token held a gigabyte of a 256-pod fleet's memory.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache
from typing import NamedTuple

from spectune.engine import contract as c
from spectune.engine.block_manager import BlockManager, blocks_for
from spectune.engine.device_time import LLAMA_1B, LLAMA_8B, Sku
from spectune.engine.draft_lag import STEADY_LAG, CatchUp, catch_up
from spectune.engine.gate import Decision, GateSettings, SpeculationGate
from spectune.engine.request_timing import RequestTiming
from spectune.engine.scheduler import Scheduler
from spectune.engine.sequence import (
    MIN_ACCEPTANCE,
    PAUSE_ITERATIONS,
    SamplingParams,
    Sequence,
    Status,
)
from spectune.engine.simulated_device import SimulatedDevice
from spectune.sim.plain_run import Member, PlainRun
from spectune.sim.spec_run import SpecRun

Labels = tuple[tuple[str, str], ...]
HISTOGRAMS = (c.TIME_TO_FIRST_TOKEN, c.INTER_TOKEN_LATENCY, c.E2E_REQUEST_LATENCY)
SeriesKey = tuple[str, Labels]


class Span(NamedTuple):
    """What a forward feeds one sequence, as SimulatedDevice.charge reads it: only the count
    (a tuple: millions are made, a frozen dataclass took twice as long to build)."""

    tokens: range
    start: int


class SpecBill(NamedTuple):
    """A spec iteration's draft seconds apart from the verify's: the catch-up's share owed to
    the draft's prefill, its share missed while speculation was off, and the draft's own
    forwards; and the tokens drafted."""

    prefill: float
    catchup: float
    draft: float
    drafted: int


@dataclass(frozen=True)
class PodConfig:
    sku: Sku
    method: str  # draft | ngram | none
    k: int
    max_batch_size: int
    kv_cache_bytes: int
    max_model_len: int
    max_queue: int
    ttft_s: float
    tpot_s: float
    block_size: int = 16
    max_prefill_tokens: int = 8192
    min_acceptance: float = MIN_ACCEPTANCE
    pause_iterations: int = PAUSE_ITERATIONS


@dataclass(slots=True)
class Request:
    """One request as the simulator follows it: arrival, lengths, its acceptance rate."""

    index: int
    arrival: float
    prompt_tokens: int
    output_tokens: int
    acceptance: float
    workload: str = "interactive"
    slo: tuple[float, float] | None = None  # its class's (TTFT, TPOT) seconds; None: the engine's
    first_token_at: float | None = None
    last_token_at: float | None = None
    done_at: float | None = None
    outcome: str | None = None
    slo_met: bool = False  # against its class's SLO


@dataclass(eq=False, slots=True)
class Tracked(Member):
    request: Request
    undelivered: int = 0


@cache
def series_key(metric: str, **labels: str) -> SeriesKey:
    return metric, tuple(sorted(labels.items()))


@dataclass
class Series:
    """The contract's series of one engine, as its /metrics would expose them."""

    values: dict[SeriesKey, float] = field(default_factory=lambda: defaultdict(float))

    def inc(self, metric: str, by: float = 1.0, **labels: str) -> None:
        self.values[series_key(metric, **labels)] += by

    def set(self, metric: str, value: float, **labels: str) -> None:
        self.values[series_key(metric, **labels)] = value

    def observe(self, histogram: Histogram, value: float) -> None:
        """A histogram observation: _sum, _count and, with buckets, cumulative _bucket."""
        values = self.values
        values[histogram.total] += value
        values[histogram.count] += 1.0
        if histogram.buckets:  # every bucket from the first whose bound holds `value`
            for key in histogram.buckets[bisect_left(histogram.bounds, value) :]:
                values[key] += 1.0


class Histogram:
    """A histogram's series, built once rather than per observation (every request's end
    observes one): _sum, _count, and with `bounds` (ascending) a _bucket each and +Inf."""

    def __init__(self, metric: str, bounds: tuple[float, ...] = ()) -> None:
        self.total = series_key(f"{metric}_sum")
        self.count = series_key(f"{metric}_count")
        self.bounds = bounds
        les = (*map(str, bounds), "+Inf") if bounds else ()
        self.buckets = tuple(series_key(f"{metric}_bucket", le=le) for le in les)


TTFT = Histogram(c.TIME_TO_FIRST_TOKEN)
E2E = Histogram(c.E2E_REQUEST_LATENCY, c.LATENCY_BUCKETS)
ITL_SUM = series_key(f"{c.INTER_TOKEN_LATENCY}_sum")
ITL_COUNT = series_key(f"{c.INTER_TOKEN_LATENCY}_count")
SPEC_DRAFTS = series_key(c.SPEC_DRAFTS)
SPEC_DRAFT_TOKENS = series_key(c.SPEC_DRAFT_TOKENS)
SPEC_ACCEPTED_TOKENS = series_key(c.SPEC_ACCEPTED_TOKENS)


@cache
def _draft_keys(batch: int) -> tuple[SeriesKey, ...]:
    """The series one spec step's draft time adds to, by its batch size."""
    bucket = str(c.batch_bucket(batch))
    return tuple(
        series_key(metric, batch=bucket)
        for metric in (c.DRAFT_SECONDS, c.DRAFT_PREFILL_SECONDS, c.DRAFT_CATCHUP_SECONDS)
    )


@cache
def _step_keys(mode: str, batch: int, explored: bool) -> tuple[SeriesKey, ...]:
    """The series one decode step adds to, by its mode, batch size and exploration."""
    bucket = str(c.batch_bucket(batch))
    return (
        series_key(f"{c.STEP_SECONDS}_sum", mode=mode, batch=bucket),
        series_key(f"{c.STEP_SECONDS}_count", mode=mode, batch=bucket),
        series_key(c.STEP_OUTPUT_TOKENS, mode=mode, batch=bucket),
        series_key(c.ITERATIONS, mode=mode, explored="true" if explored else "false"),
    )


class Clock:
    """A pod's virtual time, which its gate reads (an exploration lease's expiry). Apart from
    the engine so that the gate holds no reference back to it: a pod that leaves the fleet is
    freed by reference count (a run pauses the cyclic collector: sim/fleet.py)."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SimEngine:
    """A pod's engine. `step(now)` runs one iteration starting at virtual time `now` and
    returns its modelled seconds (None: nothing to run); the caller advances the clock.
    `per_iteration`: every iteration writes every sequence, as the engine does (the reference
    for the runs that write them only when read, sim/plain_run.py and sim/spec_run.py)."""

    def __init__(
        self,
        name: str,
        config: PodConfig,
        gate: GateSettings,
        seed: int,
        per_iteration: bool = False,
    ) -> None:
        self.name = name
        self.config = config
        self.per_iteration = per_iteration
        # the iterations of one kind (plain or spec) since another kind
        self._run: PlainRun[Tracked] | SpecRun[Tracked] | None = None
        self.device = SimulatedDevice(config.sku, hold=False)
        self.draft_model = LLAMA_1B if config.method == "draft" else None
        per_token = LLAMA_8B.kv_bytes_per_token + (
            self.draft_model.kv_bytes_per_token if self.draft_model else 0
        )
        num_blocks = config.kv_cache_bytes // (config.block_size * per_token)
        self.admitted_concurrency = (num_blocks - 1) // blocks_for(
            config.max_model_len, config.block_size
        )
        self.scheduler = Scheduler(
            BlockManager(num_blocks, config.block_size),
            config.max_batch_size,
            config.max_prefill_tokens,
        )
        self.clock = Clock()
        self.gate = SpeculationGate(gate, random.Random(seed), wall_clock=self.clock)
        # each drafted token is accepted when a draw falls below the request's rate; a test may
        # replace it with another source of draws (a real engine's, to replay them)
        self.acceptance_draws: random.Random = random.Random(seed + 1)
        self._tracked: dict[int, Tracked] = {}
        self._next_id = 0
        self.series = Series()
        self.explored_iterations = 0
        self.decode_iterations = 0
        self.decode_tokens = 0
        info = {"device": config.sku.product, "simulated": "true", "model": "llama-8b"}
        self.series.set(c.ENGINE_INFO, 1.0, **info, draft=config.method, version="sim")
        self.series.set(c.ADMITTED_CONCURRENCY, self.admitted_concurrency)
        # as prometheus_client exposes them: unlabelled counters and histograms, and each
        # request outcome, at zero from the start (a series nobody incremented yet is 0, not
        # missing)
        for metric in (
            c.REQUESTS_SLO_MET,
            c.PROMPT_TOKENS,
            c.SPEC_DRAFTS,
            c.SPEC_DRAFT_TOKENS,
            c.SPEC_ACCEPTED_TOKENS,
            *(f"{h}_{part}" for h in HISTOGRAMS for part in ("sum", "count")),
        ):
            self.series.inc(metric, 0.0)
        for outcome in c.OUTCOMES:
            self.series.inc(c.REQUESTS, 0.0, outcome=outcome)
        for bound in (*map(str, c.LATENCY_BUCKETS), "+Inf"):
            self.series.inc(f"{c.E2E_REQUEST_LATENCY}_bucket", 0.0, le=bound)

    # --- requests -----------------------------------------------------------------

    @property
    def load(self) -> int:
        return len(self.scheduler.running) + len(self.scheduler.waiting)

    def submit(self, request: Request, now: float) -> bool:
        """Queue a request; False (and a 429, counted as rejected) when the queue is full or
        the request can never fit."""
        capacity = (self.scheduler.blocks.num_blocks - 1) * self.config.block_size
        prompt = min(request.prompt_tokens, self.config.max_model_len - 1)
        output = min(request.output_tokens, self.config.max_model_len - prompt)
        fits = prompt + output + self.config.k <= capacity
        if len(self.scheduler.waiting) >= self.config.max_queue or not fits:
            request.outcome, request.done_at = "rejected", now
            self.series.inc(c.REQUESTS, outcome="rejected")
            return False
        params = SamplingParams(max_tokens=output, ignore_eos=True)
        seq = Sequence(self._next_id, range(prompt), prompt, params)
        self._next_id += 1
        self._tracked[seq.seq_id] = Tracked(request, seq)
        self.scheduler.add(seq)
        return True

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # --- one iteration ------------------------------------------------------------

    def step(self, now: float) -> float | None:
        self.clock.now = now
        start = self.device.modelled
        seqs = self.scheduler.schedule_prefill()
        if seqs:
            self._prefill(seqs)
            seconds = self.device.modelled - start
            self._deliver(seqs, now + seconds)
            if self._run is not None:
                for s in seqs:
                    if s.status is Status.RUNNING:
                        self._join(self._tracked[s.seq_id])
        elif self.scheduler.running:
            decision = (
                self.gate.decide(len(self.scheduler.running))
                if self.config.method != "none"
                else Decision(False, False)
            )
            speculate = decision.speculate
            if not self.per_iteration:
                run = self._spec_run if speculate else self._plain_run
                seconds = run(now, decision.explored)
                if seconds is not None:
                    return seconds
            self._dissolve()
            seqs = self.scheduler.schedule_decode(lookahead=self.config.k if speculate else 0)
            if not seqs:
                return None
            if speculate:
                seconds = self._speculate(seqs, now, decision.explored)
            else:
                seconds = self._decode(seqs, now)
                self._observe_step("plain", len(seqs), len(seqs), seconds, decision.explored)
        else:
            return None
        return seconds

    def _prefill(self, seqs: list[Sequence]) -> None:
        spans = [Span(range(self.scheduler.prefill_len(s)), 0) for s in seqs]
        self.device.charge(self.device.target, spans)
        for s in seqs:
            if not s.is_resumed:
                self._commit(s, 1)
            s.plain_unread = 0

    def _plain_run(self, now: float, explored: bool) -> float | None:
        """A plain iteration from `now` through the run (sim/plain_run.py), its seconds; None
        and nothing run when the KV blocks its members need now are short (the engine's
        scheduler preempts then, per sequence)."""
        run = self._run if isinstance(self._run, PlainRun) else self._start_plain_run()
        blocks = self.scheduler.blocks
        needing = run.needing_blocks()
        if len(needing) > blocks.num_free:
            return None
        for m in needing:
            blocks.reserve(m.seq, run.length(m))
            run.reserved(m)
        n = len(self.scheduler.running)
        start = self.device.modelled
        self.device.charge_batch(self.device.target, n, run.tokens - n)
        seconds = self.device.modelled - start
        at = now + seconds
        gaps = (n - len(run.fresh)) * (at - run.last_end)
        for m in run.fresh:
            assert m.request.last_token_at is not None  # its prefill's token, at least
            gaps += at - m.request.last_token_at
        for m in run.advance(at, n):
            self.scheduler.finish(m.seq, "length")
            self._finish(m, at)
        self.series.values[ITL_SUM] += gaps
        self.series.values[ITL_COUNT] += n
        self._observe_step("plain", n, n, seconds, explored)
        return seconds

    def _start_plain_run(self) -> PlainRun[Tracked]:
        self._dissolve()
        run: PlainRun[Tracked] = PlainRun(self.config.block_size)
        self._run = run
        for s in self.scheduler.running:
            run.join(self._tracked[s.seq_id])
        return run

    def _spec_run(self, now: float, explored: bool) -> float | None:
        """A spec iteration from `now` through the run (sim/spec_run.py), its seconds; None
        and nothing run when the KV blocks its members need now are short (the engine's
        scheduler preempts then, per sequence)."""
        run = self._run if isinstance(self._run, SpecRun) else self._start_spec_run()
        if not run.reserve(self.scheduler.blocks):
            return None
        start, draft = self.device.modelled, self.draft_model
        n, drafting = run.size, run.drafting
        if draft is None:
            caught_up, proposal = CatchUp(), (0, 0, 0)
        else:
            caught_up, forward = run.catch_up()
            if caught_up.fed:
                self.device.charge_totals(draft, *forward)
            proposal = run.proposal()
        bill = self._spec_forwards(drafting, run.lengths, proposal, caught_up, start)
        seconds = self.device.modelled - start
        at = now + seconds
        floor, pause = self.config.min_acceptance, self.config.pause_iterations
        done, committed, accepted, gaps = run.commit(at, self.acceptance_draws.random, floor, pause)
        for m in done:
            self.scheduler.finish(m.seq, "length")
            self._finish(m, at)
        self._spec_books(n, drafting, committed, accepted, gaps, bill, seconds, explored)
        return seconds

    def _start_spec_run(self) -> SpecRun[Tracked]:
        self._dissolve()
        run: SpecRun[Tracked] = SpecRun(
            self.config.k, self.draft_model is not None, self.config.block_size
        )
        self._run = run
        for s in self.scheduler.running:
            t = self._tracked[s.seq_id]
            run.join(t, t.request.acceptance)
        return run

    def _join(self, t: Tracked) -> None:
        """A prefilled sequence joins the run of whichever kind is on."""
        if isinstance(self._run, SpecRun):
            self._run.join(t, t.request.acceptance)
        elif self._run is not None:
            self._run.join(t)

    def _dissolve(self) -> None:
        """End the run before another kind of iteration: every member's fields written."""
        if isinstance(self._run, PlainRun):
            for s in self.scheduler.running:
                self._run.sync(self._tracked[s.seq_id])
        elif self._run is not None:
            self._run.dissolve()
        self._run = None

    def _decode(self, seqs: list[Sequence], now: float) -> float:
        """A plain iteration from `now` as the engine runs it, its seconds: one token for each
        sequence, written and delivered when it ends (the reference `per_iteration` runs, and
        the iteration that preempts). `_commit(s, 1)` and `_deliver` in one loop: a running
        sequence always has room for one more token (it finishes when it has none), and has had
        its first token (from its prefill)."""
        start = self.device.modelled
        self.device.charge_one_each(self.device.target, [len(s.token_ids) - 1 for s in seqs])
        seconds = self.device.modelled - start
        at, tracked = now + seconds, self._tracked
        gaps = 0.0
        for s in seqs:
            length = len(s.token_ids) + 1
            s.token_ids = range(length)
            s.plain_unread += 1
            t = tracked[s.seq_id]
            r = t.request
            assert r.last_token_at is not None
            gaps += at - r.last_token_at
            r.last_token_at = at
            if length == t.final:
                self.scheduler.finish(s, "length")
                self._finish(t, at)
        self.series.values[ITL_SUM] += gaps
        self.series.values[ITL_COUNT] += len(seqs)
        return seconds

    def _speculate(self, seqs: list[Sequence], now: float, explored: bool) -> float:
        """One spec iteration from `now` as the engine runs it, its seconds: the engine's
        forwards (`_spec_forwards`), then each sequence's accepted tokens committed and
        delivered when it ends, in one loop as `_decode` does (the reference `per_iteration`
        runs, and the iteration that preempts).

        Two passes over the batch: the first sums what each forward reads (this device scales
        no context, so a forward is its sums), the second draws and commits."""
        start = self.device.modelled
        most, draft = self.config.k, self.draft_model
        members = [self._tracked[s.seq_id] for s in seqs]
        ks: list[int] = []  # drafted tokens per sequence: none while paused or finishing
        drafting = [0] * (most + 1)  # by k: the sequences drafting k tokens
        lengths = [0] * (most + 1)  # and their lengths, summed
        proposed = proposed_cached = proposed_attended = 0  # the draft's proposal's sums
        behind: list[Sequence] = []  # a draft lagging past the steady state: caught up first
        for m in members:
            s = m.seq
            length = len(s.token_ids)
            k = 0 if s.take_pause() else min(most, m.final - length - 1)
            ks.append(k)
            drafting[k] += 1
            lengths[k] += length
            if k and draft is not None:
                seen = s.draft_cached
                if length - seen > STEADY_LAG:
                    behind.append(s)
                    seen = length - 1
                fed = length - seen  # the proposal feeds what the draft has not seen
                proposed += fed
                proposed_cached += seen
                proposed_attended += fed * seen + fed * (fed - 1) // 2
        caught_up = CatchUp()
        if draft is not None:

            def read(behind: list[Sequence]) -> None:
                spans = [Span(range(len(s) - 1 - s.draft_cached), s.draft_cached) for s in behind]
                self.device.charge(draft, spans)

            caught_up = catch_up(behind, read)
        proposal = (proposed, proposed_cached, proposed_attended)
        bill = self._spec_forwards(drafting, lengths, proposal, caught_up, start)
        seconds = self.device.modelled - start
        at = now + seconds
        draw = self.acceptance_draws.random
        floor, pause = self.config.min_acceptance, self.config.pause_iterations
        committed = accepted = 0
        gaps = 0.0
        for m, k in zip(members, ks, strict=True):
            s, r = m.seq, m.request
            acc = 0
            while acc < k and draw() < r.acceptance:
                acc += 1
            length = len(s.token_ids)
            if k:
                if draft is not None:  # it has seen all but the last of what it drafted
                    s.draft_cached = length + min(acc, k - 1)
                    s.plain_unread = 0
                s.record_acceptance(acc / k, floor, pause)
            accepted += acc
            # the accepted tokens and one more, fewer at its last token (at least one: s runs)
            end = min(length + acc + 1, m.final)
            s.token_ids = range(end)
            committed += end - length
            assert r.last_token_at is not None  # its prefill's token, at least
            gaps += at - r.last_token_at
            r.last_token_at = at
            if end == m.final:
                self.scheduler.finish(s, "length")
                self._finish(m, at)
        self._spec_books(len(seqs), drafting, committed, accepted, gaps, bill, seconds, explored)
        return seconds

    def _spec_forwards(
        self,
        drafting: list[int],
        lengths: list[int],
        proposal: tuple[int, int, int],
        caught_up: CatchUp,
        start: float,
    ) -> SpecBill:
        """Charge a spec iteration's forwards after the draft's catch-up (`caught_up`, charged
        since `start`, when the iteration began): the draft's proposal (`proposal`: positions,
        cached and attended tokens summed), one forward per further drafted token, and the
        target's verify over 1 + k positions a sequence after its length - 1 cached tokens.
        `drafting[k]` sequences draft k tokens, their lengths summing to `lengths[k]`: the
        i-th forward after the proposal feeds every sequence drafting more than i tokens its
        i-th drafted token."""
        most, draft = self.config.k, self.draft_model
        catchup = prefill = draft_seconds = 0.0
        if draft is not None:
            t1 = self.device.modelled
            forwards = 0
            if proposal[0]:  # nobody drafting (all paused or finishing): no forward
                self.device.charge_totals(draft, *proposal)
                forwards += 1
            count = sum(drafting[2:])  # drafting more than i tokens, from i = 1
            tokens = sum(lengths[2:])
            for i in range(1, most):
                if not count:
                    break
                self.device.charge_batch(draft, count, tokens + count * (i - 1))
                forwards += 1
                count -= drafting[i + 1]
                tokens -= lengths[i + 1]
            draft_seconds = self.device.modelled - t1
            floor = draft_seconds / forwards if forwards else 0.0
            prefill, catchup = caught_up.split(t1 - start, floor)
        batch = tokens = drafted = attended = 0  # one pass: the fleet runs millions of these
        for k, (n, total) in enumerate(zip(drafting, lengths, strict=True)):
            batch += n
            tokens += total
            drafted += k * n
            attended += (1 + k) * (total - n) + n * k * (k + 1) // 2
        self.device.charge_totals(self.device.target, batch + drafted, tokens - batch, attended)
        return SpecBill(prefill, catchup, draft_seconds, drafted)

    def _spec_books(
        self,
        batch: int,
        drafting: list[int],
        committed: int,
        accepted: int,
        gaps: float,
        bill: SpecBill,
        seconds: float,
        explored: bool,
    ) -> None:
        """A spec iteration's series; the catch-up's seconds are kept out of the step's time."""
        values = self.series.values
        values[ITL_SUM] += gaps
        values[ITL_COUNT] += committed
        drafted, prefilled, caught_up = _draft_keys(batch)
        values[drafted] += bill.draft
        values[prefilled] += bill.prefill
        values[caught_up] += bill.catchup
        values[SPEC_DRAFTS] += batch - drafting[0]
        values[SPEC_DRAFT_TOKENS] += bill.drafted
        values[SPEC_ACCEPTED_TOKENS] += accepted
        self._observe_step("spec", batch, committed, seconds - bill.catchup, explored)

    def _commit(self, seq: Sequence, count: int) -> None:
        """Append up to `count` tokens (max_tokens bounds them), to deliver when the iteration
        ends. A finished sequence leaves the batch and frees its blocks."""
        tracked = self._tracked[seq.seq_id]
        length = len(seq.token_ids)
        taken = min(count, tracked.final - length)
        seq.token_ids = range(length + taken)
        if length + taken == tracked.final:
            self.scheduler.finish(seq, "length")
        tracked.undelivered += taken

    def _deliver(self, seqs: list[Sequence], at: float) -> None:
        """Tokens reach clients when the iteration ends: TTFT, inter-token gaps, completions."""
        gaps = tokens = 0.0
        for s in seqs:
            tracked = self._tracked[s.seq_id]
            count, tracked.undelivered = tracked.undelivered, 0
            r = tracked.request
            if count:
                if r.first_token_at is None:
                    r.first_token_at = at
                    self.series.observe(TTFT, at - r.arrival)
                else:
                    gaps += at - (r.last_token_at or at)
                    tokens += count
                r.last_token_at = at
            if s.status is Status.FINISHED:
                self._finish(tracked, at)
        if tokens:
            self.series.values[ITL_SUM] += gaps
            self.series.values[ITL_COUNT] += tokens

    def _finish(self, tracked: Tracked, at: float) -> None:
        del self._tracked[tracked.seq.seq_id]
        r = tracked.request
        r.done_at, r.outcome = at, "ok"
        assert r.first_token_at is not None
        timing = RequestTiming(r.first_token_at - r.arrival, at - r.arrival, tracked.seq.num_output)
        met = timing.meets(self.config.ttft_s, self.config.tpot_s)
        r.slo_met = timing.meets(*r.slo) if r.slo is not None else met
        self.series.inc(c.REQUESTS, outcome="ok")
        self.series.inc(c.PROMPT_TOKENS, tracked.seq.prompt_len)
        self.series.observe(E2E, timing.e2e)
        if met:
            self.series.inc(c.REQUESTS_SLO_MET)

    def _observe_step(
        self, mode: str, batch: int, tokens: int, seconds: float, explored: bool
    ) -> None:
        total, count, committed, iterations = _step_keys(mode, batch, explored)
        values = self.series.values
        values[total] += seconds
        values[count] += 1
        values[committed] += tokens
        values[iterations] += 1
        self.decode_iterations += 1
        self.decode_tokens += tokens
        self.explored_iterations += explored

    def sample(self) -> dict[SeriesKey, float]:
        """The series as a scrape reads them now: the gauges are what they are at this
        instant, as Prometheus samples them."""
        s, blocks = self.scheduler, self.scheduler.blocks
        self.series.set(c.NUM_REQUESTS_RUNNING, len(s.running))
        self.series.set(c.NUM_REQUESTS_WAITING, len(s.waiting))
        self.series.set(c.KV_CACHE_USAGE, 1 - blocks.num_free / blocks.usable_blocks)
        threshold = self.gate.settings.threshold
        self.series.set(c.SPEC_THRESHOLD, float("inf") if threshold is None else threshold)
        self.series.set(c.SPEC_EXPLORATION_RATIO, self.gate.settings.exploration_at(self.clock.now))
        return self.series.values
