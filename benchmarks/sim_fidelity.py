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

Usage: .venv/bin/python benchmarks/sim_fidelity.py [--sku L4] [--requests 64]
           [--max-batch-size 32] [--k 4] [--acceptance matched|raw] [--pooled] [--seed 0]
           [--min-acceptance 0.2] [--exploration 0.2] [--prompt 16 96] [--output 32 96]
"""

from __future__ import annotations

import argparse
import random
from collections import defaultdict
from dataclasses import dataclass, field

from spectune.engine import contract as c
from spectune.engine.config import EngineConfig
from spectune.engine.device_time import sku_named
from spectune.engine.engine import LLMEngine
from spectune.engine.gate import GateSettings
from spectune.engine.sequence import SamplingParams, Sequence
from spectune.engine.zoo.registry import resolve_model
from spectune.engine.zoo.training import corpus, held_out_prompts
from spectune.sim.engine_pod import PodConfig, Request, SimEngine

BLOCK_SIZE = 16
FEW = 20  # rows with fewer steps than this on either side are marked: noise, not fidelity


@dataclass(frozen=True)
class Job:
    prompt: list[int]
    output: int


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
    preemptions: int = 0
    # per job: (drafted, accepted) in spec iterations
    per_request: list[tuple[int, int]] = field(default_factory=list)
    # What SimEngine's acceptance RNG must draw to accept exactly what this run accepted, in
    # its order (spec iterations, then sequences in batch order): per drafted token 0.0 for
    # accepted, then 1.0 for the first rejected one.
    draws: list[float] = field(default_factory=list)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def workload(count: int, seed: int, prompt: tuple[int, int], output: tuple[int, int]) -> list[Job]:
    """`count` held-out byte prompts (the tiny models' tokens are bytes), lengths drawn from a
    seeded RNG."""
    _, held_out = corpus()
    texts = held_out_prompts(held_out, count, prompt[1])
    rng = random.Random(seed)
    return [Job(t[: rng.randint(*prompt)], rng.randint(*output)) for t in texts]


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
    min_acceptance: float = 0.2,
) -> tuple[Run, LLMEngine]:
    """The real engine (tiny target + tiny draft, greedy) on the simulated SKU's clock. Its
    KV budget holds about 60k tokens of the tiny pair (no preemption at these sizes; the
    table says if there were any)."""
    config = EngineConfig(
        model="tiny-target", draft="tiny-draft", k=k, gate=gate, device="cpu",
        max_batch_size=max_batch_size, block_size=BLOCK_SIZE, simulate_device=sku,
        min_acceptance=min_acceptance, kv_cache_bytes=256 << 20,
    )  # fmt: skip
    engine = LLMEngine(config, resolve_model=resolve_model)
    assert engine.simulation is not None
    engine.simulation.hold = False
    params = [SamplingParams(max_tokens=j.output, ignore_eos=True) for j in jobs]
    seqs = [engine.add_request(j.prompt, p) for j, p in zip(jobs, params, strict=True)]
    index = {s.seq_id: i for i, s in enumerate(seqs)}
    drafted, accepted = [0] * len(jobs), [0] * len(jobs)
    run = Run()
    while engine.has_work():
        plan = {s.seq_id: _draft_len(engine, s) for s in engine.scheduler.running}
        before = len(engine.iterations)
        updates = engine.step()
        if len(engine.iterations) == before:
            continue
        it = engine.iterations[-1]
        run.tallies[(it.mode, c.batch_bucket(it.batch_size))].add(it.seconds, it.tokens)
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


def run_sim(
    jobs: list[Job],
    rates: list[float],
    gate: GateSettings,
    engine: LLMEngine,
    replay: list[float] | None = None,
) -> Run:
    """SimEngine with the real engine's settings, the same requests all submitted at 0;
    `replay`: the real run's acceptance draws (Replay; `rates` all 0.5). Its gate draws
    exploration from the engine's seed, as the engine's does."""
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
    for i, (job, rate) in enumerate(zip(jobs, rates, strict=True)):
        assert sim.submit(Request(i, 0.0, len(job.prompt), job.output, rate), 0.0)
    run = Run()
    now = 0.0
    while sim.has_work():
        running, decoded = len(sim.scheduler.running), sim.decode_iterations
        seconds = sim.step(now)
        if seconds is None:
            break
        now += seconds
        if sim.decode_iterations == decoded:  # a prefill: its batch is who joined
            admitted = len(sim.scheduler.running) - running
            run.tallies[("prefill", c.batch_bucket(admitted))].add(seconds, admitted)
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
            f"s, catch-up {run.catchup_seconds:.3f} s, preemptions {run.preemptions}"
        )
    return lines


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
        "--min-acceptance", type=float, default=0.2,
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
    args = parser.parse_args()
    jobs = workload(args.requests, args.seed, tuple(args.prompt), tuple(args.output))
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
    for title, gate in gates:
        real, engine = run_real(
            jobs, gate, args.sku, args.k, args.max_batch_size, args.min_acceptance
        )
        rates = acceptances(real, args.k, args.acceptance, args.pooled)
        sim = run_sim(jobs, rates, gate, engine)
        print("\n".join(table(title, real, sim)) + "\n")
        if real.drafted:
            replayed = run_sim(jobs, [0.5] * len(jobs), gate, engine, real.draws)
            print("\n".join(table(f"{title}, the real acceptances replayed", real, replayed)))
            print()


if __name__ == "__main__":
    main()
