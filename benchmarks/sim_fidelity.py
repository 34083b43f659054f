"""How faithful the fleet simulator's engine pod (sim/engine_pod.py) is to the real engine on a
simulated SKU: the same requests run to completion in process on both, and per mode and batch
bucket the mean modelled step time and tokens per step are compared.

The real engine (engine/engine.py) runs the tiny target and draft with `simulate_device`, so
each forward is charged to the SKU's modelled clock for the virtual Llama 8B / 1B it stands
for; SimEngine charges the same virtual models. Both see the same prompt and output lengths,
all submitted at time 0. The real run's acceptance (accepted / drafted, per request) becomes
each simulated request's acceptance: by default converted to the per-token probability
SimEngine's iid acceptance needs for the same expected accepted / drafted (`--acceptance
matched`), or taken as it is (`raw`). Gates: always speculate (threshold None); never
(threshold 0), whose plain steps must match exactly; and always speculate with a share of
explored plain steps (`--exploration`), which brings in the draft's catch-up.

Each speculating run is also replayed: SimEngine's acceptance RNG is given the draws that
make it accept exactly what the real engine accepted, sequence by sequence and iteration by
iteration, so both run the same batches through the same lengths and pauses, and any
difference left in a bucket is a forward the simulator charges differently.

With `--clients N` the requests come from N closed-loop clients instead (each sends its next
when its last finishes, after a `--think` pause, on the modelled clock), and the comparison
adds what a fleet's goodput rests on: the running-batch distribution over decode steps and
the goodput under an SLO, simulated over real, while the clients kept sending.

Usage: .venv/bin/python benchmarks/sim_fidelity.py [--sku L4] [--requests 64]
           [--max-batch-size 32] [--k 4] [--acceptance matched|raw] [--pooled] [--seed 0]
           [--min-acceptance 0.05] [--exploration 0.2] [--prompt 16 96] [--output 32 96]
           [--clients 24 [--think 500] [--slo 1000 60]]
"""

from __future__ import annotations

import argparse
import heapq
import random
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from spectune.engine import contract as c
from spectune.engine.config import EngineConfig
from spectune.engine.device_time import sku_named
from spectune.engine.engine import LLMEngine
from spectune.engine.gate import GateSettings
from spectune.engine.request_timing import RequestTiming
from spectune.engine.sequence import MIN_ACCEPTANCE, SamplingParams, Sequence, Status
from spectune.engine.zoo.registry import resolve_model
from spectune.engine.zoo.training import corpus, held_out_prompts
from spectune.sim.engine_pod import PodConfig, Request, SimEngine

BLOCK_SIZE = 16
FEW = 20  # rows with fewer steps than this on either side are marked: noise, not fidelity


@dataclass(frozen=True)
class Job:
    prompt: list[int]
    output: int
    think: float = 0.0  # closed loop: seconds its client waits after its last request finished


@dataclass
class Tally:
    """Steps of one (mode, batch bucket): count, modelled seconds, tokens committed."""

    steps: int = 0
    seconds: float = 0.0
    tokens: int = 0

    def add(self, seconds: float, tokens: int, steps: int = 1) -> None:
        self.steps += steps
        self.seconds += seconds
        self.tokens += tokens

    @property
    def mean_ms(self) -> float:
        return 1e3 * self.seconds / self.steps

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps


@dataclass
class Run:
    """What one run did: tallies per (mode, bucket), speculation counts, the modelled clock."""

    tallies: dict[tuple[str, int], Tally] = field(default_factory=lambda: defaultdict(Tally))
    drafted: int = 0
    accepted: int = 0
    draft_prefill_seconds: float = 0.0
    catchup_seconds: float = 0.0
    total_seconds: float = 0.0
    preemptions: int | None = 0  # None: not known (a served engine's /metrics has none)
    # per job: (drafted, accepted) in spec iterations
    per_request: list[tuple[int, int]] = field(default_factory=list)
    # What SimEngine's acceptance RNG must draw to accept exactly what this run accepted, in
    # its order (spec iterations, then sequences in batch order): per drafted token 0.0 for
    # accepted, then 1.0 for the first rejected one.
    draws: list[float] = field(default_factory=list)
    # Closed-loop runs: each decode step's (modelled end, running batch); each request's
    # (arrival, timing); when the last request was sent. Until then the clients keep sending,
    # after it the run drains, which a closed loop that keeps sending never does.
    batches: list[tuple[float, int]] = field(default_factory=list)
    timings: list[tuple[float, RequestTiming]] = field(default_factory=list)
    last_sent: float = 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def steady_batches(self) -> list[int]:
        """The running batch of each decode step while the clients kept sending."""
        return [b for at, b in self.batches if at <= self.last_sent]

    def met(self, ttft_s: float, tpot_s: float) -> int:
        """Requests finished while the clients kept sending that met both SLOs."""
        return sum(
            t.meets(ttft_s, tpot_s) for at, t in self.timings if at + t.e2e <= self.last_sent
        )


def workload(
    count: int, seed: int, prompt: tuple[int, int], output: tuple[int, int], think_s: float = 0.0
) -> list[Job]:
    """`count` held-out byte prompts (the tiny models' tokens are bytes), lengths drawn from a
    seeded RNG; think times exponential with mean `think_s`, from an RNG of their own (the
    lengths stay those of the seed)."""
    _, held_out = corpus()
    texts = held_out_prompts(held_out, count, prompt[1])
    rng, pause = random.Random(seed), random.Random(seed + 1)
    return [
        Job(t[: rng.randint(*prompt)], rng.randint(*output),
            pause.expovariate(1 / think_s) if think_s else 0.0)
        for t in texts
    ]  # fmt: skip


class Clients:
    """Who sends which job when: `count` closed-loop clients send the first jobs at 0, and
    each the next job that job's think time after its last finished; None: every job at 0.
    The real run and the simulated one share it, so both send alike."""

    def __init__(self, jobs: list[Job], count: int | None) -> None:
        self.jobs = jobs
        self.next = len(jobs) if count is None else min(count, len(jobs))
        self.queued = [(0.0, i) for i in range(self.next)]  # a heap of (send time, job)
        self.last_sent = 0.0

    def due(self, now: float) -> list[tuple[float, int]]:
        """The (send time, job)s due by `now`, taken off the queue."""
        out = []
        while self.queued and self.queued[0][0] <= now:
            out.append(heapq.heappop(self.queued))
            self.last_sent = max(self.last_sent, out[-1][0])
        return out

    def finished(self, at: float) -> None:
        """A request finished at `at`: its client queues the next job, if any is left."""
        if self.next < len(self.jobs):
            heapq.heappush(self.queued, (at + self.jobs[self.next].think, self.next))
            self.next += 1

    def next_send(self) -> float | None:
        return self.queued[0][0] if self.queued else None


def _draft_len(engine: LLMEngine, s: Sequence) -> int:
    """What LLMEngine._draft_len will give `s` this iteration, without using up a pause."""
    if s.paused_iterations > 0:
        return 0
    return max(0, min(engine.k, s.remaining - 1, engine.max_model_len - len(s) - 1))


def run_real(
    jobs: list[Job],
    gate: GateSettings,
    sku: str,
    k: int,
    max_batch_size: int,
    min_acceptance: float = MIN_ACCEPTANCE,
    clients: int | None = None,
) -> tuple[Run, LLMEngine]:
    """The real engine (tiny target + tiny draft, greedy) on the simulated SKU's clock. Its
    KV budget holds about 60k tokens of the tiny pair (no preemption at these sizes; the
    table says if there were any). Every job is queued at 0, or with `clients`, that many
    closed-loop clients each send the next job its think time after theirs finished (on the
    modelled clock, plus the time the engine sat idle waiting for one)."""
    config = EngineConfig(
        model="tiny-target", draft="tiny-draft", k=k, gate=gate, device="cpu",
        max_batch_size=max_batch_size, block_size=BLOCK_SIZE, simulate_device=sku,
        min_acceptance=min_acceptance, kv_cache_bytes=256 << 20,
    )  # fmt: skip
    engine = LLMEngine(config, resolve_model=resolve_model)
    assert engine.simulation is not None
    engine.simulation.hold = False
    index: dict[int, int] = {}  # seq_id -> job
    arrived, first, done = [0.0] * len(jobs), [0.0] * len(jobs), [0.0] * len(jobs)
    sending = Clients(jobs, clients)
    idle = 0.0  # the run's clock is the modelled one plus the time the engine sat idle
    drafted, accepted = [0] * len(jobs), [0] * len(jobs)
    run = Run()
    while True:
        for at, i in sending.due(engine.simulation.modelled + idle):
            params = SamplingParams(max_tokens=jobs[i].output, ignore_eos=True)
            index[engine.add_request(jobs[i].prompt, params).seq_id] = i
            arrived[i] = at
        if not engine.has_work():
            if (at := sending.next_send()) is None:
                break
            idle = at - engine.simulation.modelled
            continue
        plan = {s.seq_id: _draft_len(engine, s) for s in engine.scheduler.running}
        before = len(engine.iterations)
        updates = engine.step()
        now = engine.simulation.modelled + idle
        for u in updates:
            i = index[u.seq.seq_id]
            if u.new_tokens and not first[i]:
                first[i] = now
            if u.seq.status is Status.FINISHED and not done[i]:
                done[i] = now
                sending.finished(now)
        if len(engine.iterations) == before:
            continue
        it = engine.iterations[-1]
        run.tallies[(it.mode, c.batch_bucket(it.batch_size))].add(it.seconds, it.tokens)
        if it.mode != "prefill":
            run.batches.append((now, it.batch_size))
        run.draft_prefill_seconds += it.draft_prefill_seconds
        run.catchup_seconds += it.catchup_seconds
        if it.mode != "spec":
            continue
        step_drafted = step_accepted = 0
        for u in updates:
            i = index[u.seq.seq_id]
            n, acc = plan[u.seq.seq_id], len(u.new_tokens) - 1
            drafted[i], accepted[i] = drafted[i] + n, accepted[i] + acc
            run.draws += [0.0] * acc + ([1.0] if acc < n else [])
            step_drafted, step_accepted = step_drafted + n, step_accepted + acc
        # the per-request books add up to what the engine counted
        assert (step_drafted, step_accepted) == (it.drafted, it.accepted), (it, step_drafted)
        run.drafted += it.drafted
        run.accepted += it.accepted
    run.total_seconds = engine.simulation.modelled
    run.preemptions = engine.scheduler.num_preemptions
    run.per_request = list(zip(drafted, accepted, strict=True))
    run.timings = [
        (a, RequestTiming(f - a, d - a, j.output))
        for a, f, d, j in zip(arrived, first, done, jobs, strict=True)
    ]
    run.last_sent = sending.last_sent
    return run, engine


def per_token_rate(ratio: float, k: int) -> float:
    """The probability p with which iid acceptance of k drafted tokens (stopping at the first
    rejection) accepts `ratio` of them on average: (p + p^2 + ... + p^k) / k = ratio."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        p = (lo + hi) / 2
        if sum(p**i for i in range(1, k + 1)) / k < ratio:
            lo = p
        else:
            hi = p
    return (lo + hi) / 2


def acceptances(real: Run, k: int, how: str, pooled: bool) -> list[float]:
    """Each simulated request's acceptance from the real run's: its own or the run's pooled
    accepted / drafted, `matched` (per_token_rate) or `raw`."""
    ratios = [
        real.acceptance if pooled or not drafted else accepted / drafted
        for drafted, accepted in real.per_request
    ]
    return [per_token_rate(r, k) if how == "matched" else r for r in ratios]


class Replay:
    """Stands in for SimEngine's acceptance RNG: `random()` returns the real run's draws, so
    with every rate at 0.5 the simulator accepts, sequence by sequence and iteration by
    iteration, exactly what the real engine accepted. Its runs then stay in step with the
    real one (same lengths, pauses, batches), and every step must cost the same."""

    def __init__(self, draws: list[float]) -> None:
        self._draws = iter(draws)

    def random(self) -> float:
        return next(self._draws)


class Configured(Protocol):
    """What run_sim reads of the engine it stands in for: an LLMEngine, or what a served
    engine was started with (benchmarks/sim_fidelity_cluster.py)."""

    @property
    def config(self) -> EngineConfig: ...

    @property
    def max_model_len(self) -> int: ...


def run_sim(
    jobs: list[Job],
    rates: list[float],
    gate: GateSettings,
    engine: Configured,
    replay: list[float] | None = None,
    clients: int | None = None,
) -> Run:
    """SimEngine with the real engine's settings, the same requests all submitted at 0 (or
    sent by `clients` closed-loop clients, as run_real's); `replay`: the real run's acceptance
    draws (Replay; `rates` all 0.5). Its gate draws exploration from the engine's seed, as the
    engine's does."""
    cfg = engine.config
    pod = PodConfig(
        sku=sku_named(cfg.simulate_device or ""), method="draft", k=cfg.k,
        max_batch_size=cfg.max_batch_size, kv_cache_bytes=64 << 30,
        max_model_len=engine.max_model_len, max_queue=len(jobs) + 1, ttft_s=1e9, tpot_s=1e9,
        block_size=cfg.block_size, max_prefill_tokens=cfg.max_prefill_tokens,
        min_acceptance=cfg.min_acceptance, pause_iterations=cfg.pause_iterations,
    )  # fmt: skip
    sim = SimEngine("fidelity", pod, gate, cfg.seed)
    if replay is not None:
        sim.acceptance_draws = Replay(replay)  # type: ignore[assignment]
    requests: list[Request] = []
    sending = Clients(jobs, clients)
    finished = 0  # of `requests`, after the last step
    run = Run()
    now = 0.0
    while True:
        for at, i in sending.due(now):
            requests.append(Request(i, at, len(jobs[i].prompt), jobs[i].output, rates[i]))
            assert sim.submit(requests[-1], at)
        if not sim.has_work():
            if (at := sending.next_send()) is None:
                break
            now = at
            continue
        running, decoded = len(sim.scheduler.running), sim.decode_iterations
        seconds = sim.step(now)
        if seconds is None:
            break
        now += seconds
        if sim.decode_iterations == decoded:  # a prefill: its batch is who joined
            admitted = len(sim.scheduler.running) - running
            run.tallies[("prefill", c.batch_bucket(admitted))].add(seconds, admitted)
        else:
            run.batches.append((now, running))
        done = sum(r.done_at is not None for r in requests)
        for _ in range(done - finished):
            sending.finished(now)
        finished = done
    values = sim.series.values
    for (metric, labels), value in list(values.items()):
        if metric == f"{c.STEP_SECONDS}_count":
            d = dict(labels)
            key = (d["mode"], int(d["batch"]))
            run.tallies[key].add(
                values[(f"{c.STEP_SECONDS}_sum", labels)],
                round(values[(c.STEP_OUTPUT_TOKENS, labels)]),
                round(value),
            )
        elif metric == c.DRAFT_PREFILL_SECONDS:
            run.draft_prefill_seconds += value
        elif metric == c.DRAFT_CATCHUP_SECONDS:
            run.catchup_seconds += value
    run.drafted = round(values.get((c.SPEC_DRAFT_TOKENS, ()), 0.0))
    run.accepted = round(values.get((c.SPEC_ACCEPTED_TOKENS, ()), 0.0))
    run.total_seconds = now
    run.preemptions = sim.scheduler.num_preemptions
    run.timings = [
        (
            r.arrival,
            RequestTiming(r.first_token_at - r.arrival, r.done_at - r.arrival, r.output_tokens),
        )
        for r in requests
        if r.first_token_at is not None and r.done_at is not None
    ]
    run.last_sent = sending.last_sent
    return run


@dataclass(frozen=True)
class Row:
    mode: str
    bucket: int
    real: Tally
    sim: Tally

    @property
    def ratio(self) -> float:
        """Simulated over real mean step time."""
        return self.sim.mean_ms / self.real.mean_ms


def compare(real: Run, sim: Run) -> list[Row]:
    """One row per (mode, bucket) both runs have."""
    keys = sorted(set(real.tallies) & set(sim.tallies), key=lambda m: (m[0], m[1]))
    return [Row(mode, bucket, real.tallies[mode, bucket], sim.tallies[mode, bucket])
            for mode, bucket in keys]  # fmt: skip


def unmatched(real: Run, sim: Run) -> list[str]:
    """(mode, bucket)s only one run has, with their step counts."""
    out = []
    for name, run, other in (("real", real, sim), ("sim", sim, real)):
        for key in sorted(set(run.tallies) - set(other.tallies)):
            out.append(f"{key[0]}/{key[1]}: {run.tallies[key].steps} steps in {name} only")
    return out


def table(title: str, real: Run, sim: Run) -> list[str]:
    lines = [
        f"## {title}",
        "",
        "| mode | bucket | real steps | sim steps | real ms | sim ms | sim/real "
        "| real tok/step | sim tok/step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in compare(real, sim):
        few = "~" if min(r.real.steps, r.sim.steps) < FEW else ""
        lines.append(
            f"| {r.mode} | {r.bucket}{few} | {r.real.steps} | {r.sim.steps} | {r.real.mean_ms:.3f} "
            f"| {r.sim.mean_ms:.3f} | {r.ratio:.4f} | {r.real.tokens_per_step:.2f} "
            f"| {r.sim.tokens_per_step:.2f} |"
        )
    lines.append("")
    lines += [f"- {line}" for line in unmatched(real, sim)]
    for name, run in (("real", real), ("sim", sim)):
        lines.append(
            f"- {name}: acceptance {run.acceptance:.3f} ({run.accepted}/{run.drafted}), "
            f"modelled {run.total_seconds:.3f} s, draft prefill {run.draft_prefill_seconds:.3f} "
            f"s, catch-up {run.catchup_seconds:.3f} s, preemptions "
            f"{'unknown' if run.preemptions is None else run.preemptions}"
        )
    return lines


def shares(counts: Mapping[int, int]) -> dict[int, float]:
    """Each batch bucket's share of the decode steps, from the steps per bucket."""
    total = sum(counts.values())
    return {bucket: n / total for bucket, n in sorted(counts.items()) if n}


def batch_shares(run: Run) -> dict[int, float]:
    """Each batch bucket's share of the decode steps run while the clients kept sending."""
    counts: dict[int, int] = defaultdict(int)
    for b in run.steady_batches:
        counts[c.batch_bucket(b)] += 1
    return shares(counts)


@dataclass(frozen=True)
class Steady:
    """One side of a closed-loop run while its clients kept sending: each batch bucket's
    share of the decode steps, the mean running batch, the requests that finished in time
    meeting the SLO, how long the clients sent (modelled seconds) and the run's acceptance."""

    shares: dict[int, float]
    batch: float
    met: int
    seconds: float
    acceptance: float

    @property
    def goodput(self) -> float:
        return self.met / self.seconds


def steady(run: Run, ttft_s: float, tpot_s: float) -> Steady:
    batches = run.steady_batches
    return Steady(
        batch_shares(run),
        sum(batches) / len(batches),
        run.met(ttft_s, tpot_s),
        run.last_sent,
        run.acceptance,
    )


@dataclass(frozen=True)
class ClosedLoop:
    """A closed-loop run's steady part on both sides: mean running batch, the running-batch
    distributions' distance (total variation over batch buckets: the share of decode steps
    that would have to move bucket) and goodput (SLO-met requests per modelled second)."""

    shares: tuple[dict[int, float], dict[int, float]]  # (real, sim): batch_shares
    batch: tuple[float, float]
    goodput: tuple[float, float]
    met: tuple[int, int]

    @property
    def buckets(self) -> list[int]:
        return sorted(set(self.shares[0]) | set(self.shares[1]))

    @property
    def distance(self) -> float:
        real, sim = self.shares
        return sum(abs(real.get(b, 0) - sim.get(b, 0)) for b in self.buckets) / 2


def compared(real: Steady, sim: Steady) -> ClosedLoop:
    return ClosedLoop(
        shares=(real.shares, sim.shares),
        batch=(real.batch, sim.batch),
        goodput=(real.goodput, sim.goodput),
        met=(real.met, sim.met),
    )


def closed_loop(real: Run, sim: Run, ttft_s: float, tpot_s: float) -> ClosedLoop:
    return compared(steady(real, ttft_s, tpot_s), steady(sim, ttft_s, tpot_s))


def closed_loop_lines(title: str, real: Run, sim: Run, ttft_s: float, tpot_s: float) -> list[str]:
    sides = steady(real, ttft_s, tpot_s), steady(sim, ttft_s, tpot_s)
    return steady_lines(title, *sides, ttft_s, tpot_s)


def steady_lines(title: str, real: Steady, sim: Steady, ttft_s: float, tpot_s: float) -> list[str]:
    found = compared(real, sim)
    lines = [
        f"## {title}",
        "",
        "| batch bucket | real share of decode steps | sim share |",
        "|---|---|---|",
    ]
    for bucket in found.buckets:
        shares = (found.shares[0].get(bucket, 0), found.shares[1].get(bucket, 0))
        lines.append(f"| {bucket} | {shares[0]:.3f} | {shares[1]:.3f} |")
    (rb, sb), (rg, sg) = found.batch, found.goodput
    return [
        *lines,
        "",
        f"- while the clients kept sending (real {real.seconds:.3f} s, sim "
        f"{sim.seconds:.3f} s of modelled time):",
        f"- mean running batch: real {rb:.2f}, sim {sb:.2f} (x{sb / rb:.4f}); distributions "
        f"{found.distance:.3f} apart (total variation)",
        f"- goodput (TTFT {ttft_s * 1e3:.0f} ms, TPOT {tpot_s * 1e3:.0f} ms): real {rg:.2f} "
        f"req/s ({found.met[0]} met), sim {sg:.2f} ({found.met[1]} met)"
        + (f": x{sg / rg:.4f}" if rg else ""),
        f"- acceptance: real {real.acceptance:.3f}, sim {sim.acceptance:.3f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sku", default="L4")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompt", type=int, nargs=2, default=(16, 96), metavar=("MIN", "MAX"))
    parser.add_argument("--output", type=int, nargs=2, default=(32, 96), metavar=("MIN", "MAX"))
    parser.add_argument("--acceptance", choices=("matched", "raw"), default="matched")
    parser.add_argument(
        "--min-acceptance", type=float, default=MIN_ACCEPTANCE,
        help="the engine's pause floor (0: never pause a sequence; 1: pause after every draft)",
    )  # fmt: skip
    parser.add_argument(
        "--pooled", action="store_true", help="every request gets the run's acceptance"
    )
    parser.add_argument(
        "--exploration", type=float, default=0.2,
        help="a third run: always speculate but explore plain steps at this share (0: none)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="the workload's lengths")
    parser.add_argument(
        "--clients", type=int,
        help="closed-loop clients instead of every request queued at 0: each sends its next "
        "request when its last finishes; adds the running-batch distribution and goodput",
    )  # fmt: skip
    parser.add_argument(
        "--slo", type=float, nargs=2, default=(1000.0, 60.0), metavar=("TTFT_MS", "TPOT_MS"),
        help="the goodput's SLO with --clients",
    )  # fmt: skip
    parser.add_argument(
        "--think", type=float, default=0.0, metavar="MS",
        help="with --clients: each client's mean pause between requests (exponential)",
    )  # fmt: skip
    args = parser.parse_args()
    jobs = workload(
        args.requests, args.seed, tuple(args.prompt), tuple(args.output), args.think / 1e3
    )
    print(
        f"{len(jobs)} requests on {args.sku}, k={args.k}, max batch {args.max_batch_size}, "
        f"acceptance {args.acceptance}{' pooled' if args.pooled else ' per request'}, "
        f"pause floor {args.min_acceptance}; ~: fewer than {FEW} steps on a side\n"
    )
    gates = [
        ("always speculate (threshold None)", GateSettings(threshold=None)),
        ("plain only (threshold 0)", GateSettings(threshold=0)),
    ]
    if args.exploration:
        gates.append(
            (
                f"mixed (threshold None, exploration {args.exploration})",
                GateSettings(threshold=None, exploration=args.exploration),
            )
        )
    ttft_s, tpot_s = (v / 1e3 for v in args.slo)
    for title, gate in gates:
        real, engine = run_real(
            jobs, gate, args.sku, args.k, args.max_batch_size, args.min_acceptance, args.clients
        )
        rates = acceptances(real, args.k, args.acceptance, args.pooled)
        sim = run_sim(jobs, rates, gate, engine, clients=args.clients)
        print("\n".join(table(title, real, sim)) + "\n")
        if args.clients:
            loop = f"{title}: {args.clients} closed-loop clients"
            print("\n".join(closed_loop_lines(loop, real, sim, ttft_s, tpot_s)) + "\n")
        if real.drafted:
            replayed = run_sim(jobs, [0.5] * len(jobs), gate, engine, real.draws, args.clients)
            print("\n".join(table(f"{title}, the real acceptances replayed", real, replayed)))
            print()


if __name__ == "__main__":
    main()
