"""`spectune-engine bench`: measure the crossover, set the gate on it, and show what that
buys against never and always speculating.

1. Batch sweep (in-process engine): per batch bucket, spec vs plain decode iterations →
   speedup(batch) → the crossover and the recommended threshold.
2. Load sweep (in-process engine or a URL): load levels x policies {never, always,
   gated at the threshold} → goodput, throughput, latency percentiles, acceptance,
   mean running batch; and the crossover again, from the per-bucket steps the traffic
   produced, which is how the operator sees it.
3. The verdict on the gate, and the batch-1 step against the memory roofline.

The result is written as it grows: a failed run still leaves what it measured.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, TypeVar

from tqdm import tqdm

from spectune.engine.bench.batch_sweep import SweepSettings, sweep
from spectune.engine.bench.loadgen import (
    NO_COUNTERS,
    Bounds,
    Client,
    Counters,
    Load,
    RequestResult,
    run_level,
    summarize,
)
from spectune.engine.bench.machine import copy_bandwidth, default_device, describe, weight_bytes
from spectune.engine.bench.report import describe_crossover, write_report
from spectune.engine.bench.schema import (
    BatchSweep,
    BenchResult,
    BucketPoint,
    CrossoverResult,
    LevelRatio,
    LevelResult,
    LoadSweep,
    Roofline,
    Slo,
    Target,
    Verdict,
)
from spectune.engine.bench.targets import EngineTarget, HttpTarget
from spectune.engine.bench.trace import TraceSettings, replay_policies
from spectune.engine.bench.workload import (
    BenchError,
    Prompt,
    RequestSpec,
    load_prompts,
    parse_lengths,
    request_stream,
    shipped_prompts,
)
from spectune.engine.config import EngineConfig
from spectune.engine.contract import BATCH_BUCKETS, batch_bucket
from spectune.engine.crossover import (
    Crossover,
    SpeedupPoint,
    StatsByBucket,
    aggregate_median,
    bucket_distance,
    crossover_of,
    judge_gate,
    merge,
    speedup_curve,
)
from spectune.engine.device_time import sku_named
from spectune.engine.engine import LLMEngine
from spectune.engine.torch_thread import on_torch_thread
from spectune.engine.zoo.registry import resolve_model

POLICY_THRESHOLDS: dict[str, int | None] = {"never": 0, "always": None}
GATE_FLOOR = 0.97
DEFAULT_BATCH_SIZES = tuple(b for b in BATCH_BUCKETS if b <= 32)


@dataclass(frozen=True)
class BenchSettings:
    model: str = "tiny-target"
    draft: str | None = "tiny-draft"
    method: str = "auto"
    k: int = 4
    device: str | None = None
    kv_cache_bytes: int | None = None
    url: str | None = None  # an OpenAI-compatible server instead of the in-process engine
    served_model: str | None = None
    admin_token: str | None = None
    sweep: Literal["both", "batch", "load"] = "both"
    batch: SweepSettings = field(default_factory=lambda: SweepSettings(DEFAULT_BATCH_SIZES))
    load_kind: Literal["closed", "open"] = "closed"
    loads: tuple[float, ...] = (1, 2, 4, 8, 16)
    requests: int | None = None  # per level; default 8 per client (closed), 20 s (open)
    duration_s: float = 120.0
    rounds: int = 1  # policies take turns this many times per load level
    request_timeout_s: float = 300.0
    prompts_file: Path | None = None
    prompt_len: int = 64
    output_lengths: str = "64"
    temperature: float = 0.0  # of every request, a trace replay's too
    slo: Slo = field(default_factory=lambda: Slo(ttft_ms=1000, tpot_ms=100))
    threshold: int | None = None  # gate here instead of at the measured crossover
    policies: tuple[str, ...] = ("never", "always", "gated")
    seed: int = 0
    out: Path = Path("bench-report")
    simulate_device: str | None = None  # a GPU SKU: real tokens, its modelled clock
    simulate_time_scale: float = 1.0
    simulate_extra_context: int = 0
    simulate_context_scale: float = 1.0
    trace: TraceSettings | None = None  # replayed under each policy instead of load levels

    def requests_at(self, load: float) -> int:
        if self.requests:
            return self.requests
        if self.load_kind == "closed":
            return max(16, 8 * int(load))
        return max(16, math.ceil(20 * load))


def check(settings: BenchSettings) -> None:
    """Refuse settings that cannot work, before anything is loaded or sent."""
    s = settings
    if s.url and s.sweep != "load":
        raise BenchError("the batch sweep needs the in-process engine; with --url use --sweep load")
    if s.sweep != "batch" and not s.loads:
        raise BenchError("no load levels given")
    if s.load_kind == "closed" and any(x < 1 or x != int(x) for x in s.loads):
        raise BenchError("closed-loop concurrency levels must be whole numbers >= 1")
    if s.rounds < 1 or s.duration_s <= 0:
        raise BenchError("--rounds must be at least 1 and --duration-s positive")
    if any(x <= 0 for x in s.loads):
        raise BenchError("load levels must be positive")
    unknown = set(s.policies) - {"never", "always", "gated", "current"}
    if unknown or not s.policies:
        raise BenchError(f"policies are never, always, gated or current; got {s.policies}")
    if s.url and s.policies != ("current",) and not s.admin_token:
        raise BenchError(
            "switching policies on a URL needs --admin-token-file (or --policies current)"
        )
    if "current" in s.policies and len(s.policies) > 1:
        raise BenchError("policy 'current' (the server as configured) runs alone")
    if s.trace and (s.rounds != 1 or s.prompts_file):
        raise BenchError(
            "--trace replays the recorded lengths once per policy: no --rounds, --prompts"
        )
    if s.trace and s.sweep == "load" and "gated" in s.policies and s.threshold is None:
        raise BenchError(
            "gating a trace replay needs --threshold or the batch sweep (--sweep both)"
        )
    gated_unmeasured = s.sweep == "load" and "gated" in s.policies and s.threshold is None
    if gated_unmeasured and not {"never", "always"} <= set(s.policies):
        raise BenchError("gating needs --threshold, or policies never and always to measure it")
    if s.simulate_device and s.url:
        raise BenchError(
            "--simulate-device needs the in-process engine (a server simulates its own)"
        )
    if s.simulate_device:
        try:
            sku_named(s.simulate_device)
        except ValueError as err:
            raise BenchError(str(err)) from None
    if not 0 <= s.temperature <= 100:
        raise BenchError(f"--temperature must be in [0, 100], got {s.temperature:g}")
    if not s.simulate_time_scale > 0:
        raise BenchError(f"--simulate-time-scale must be > 0, got {s.simulate_time_scale:g}")
    if not s.simulate_context_scale > 0:
        raise BenchError(f"--simulate-context-scale must be > 0, got {s.simulate_context_scale:g}")


@dataclass
class _Run:
    """The result so far; every phase adds to it, and it is written whatever happens."""

    settings: BenchSettings
    result: BenchResult
    prompts: list[Prompt]
    log: Callable[[str], None]
    make_engine: Callable[[EngineConfig], LLMEngine] | None
    steps: dict[str, list[StatsByBucket]] = field(default_factory=dict)

    def update(self, **fields: object) -> None:
        self.result = self.result.model_copy(update=fields)


def run(
    settings: BenchSettings,
    command: str,
    log: Callable[[str], None],
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    make_engine: Callable[[EngineConfig], LLMEngine] | None = None,
) -> BenchResult:
    """Run the bench and write its report to settings.out; on failure the partial report is
    written, then the error is raised (a BenchError names where the partial result is).
    `make_engine` builds the in-process engine (default: LLMEngine with the zoo's names)."""
    check(settings)
    parse_lengths(settings.output_lengths)
    prompts = (
        load_prompts(settings.prompts_file)
        if settings.prompts_file
        else shipped_prompts(64, settings.prompt_len)
    )
    state = _Run(settings, _start(settings, command, now()), prompts, log, make_engine)
    try:
        asyncio.run(_main(state))
    except BaseException as err:
        state.update(error=str(err) or type(err).__name__)
        written = write_report(state.result, settings.out)
        if isinstance(err, ValueError):
            raise BenchError(f"{err} (partial results: {written[0]})") from err
        raise
    state.update(status="complete")
    write_report(state.result, settings.out)
    return state.result


def _start(settings: BenchSettings, command: str, started: datetime) -> BenchResult:
    device = "remote" if settings.url else (settings.device or default_device())
    if settings.simulate_device and not settings.url:
        sku = sku_named(settings.simulate_device)
        device = f"{sku.product} (simulated, time x{settings.simulate_time_scale:g}) on {device}"
    method = (
        settings.method if settings.method != "auto" else ("draft" if settings.draft else "none")
    )
    return BenchResult(
        status="incomplete",
        command=command,
        started_at=started.isoformat(timespec="seconds"),
        machine=describe(device),
        target=Target(
            model=settings.model,
            draft=settings.draft,
            method=method,
            k=settings.k,
            url=settings.url,
        ),
    )


async def _main(state: _Run) -> None:
    s = state.settings
    if s.url:
        async with HttpTarget(s.url, s.served_model, s.admin_token, s.request_timeout_s) as http:
            state.update(target=await http.describe())
            await _load_phase(state, http)
    else:
        await _in_process(state)
    _judge(state)


async def _in_process(state: _Run) -> None:
    """The engine is built, and both sweeps run, on the torch thread, as serving does."""
    s = state.settings
    engine = await on_torch_thread(lambda: _engine(s, state.make_engine))
    async with EngineTarget(engine) as target:
        if s.sweep != "load":
            await _batch_phase(state, target)
        if s.sweep != "batch":
            await _load_phase(state, target)


def _engine(s: BenchSettings, make: Callable[[EngineConfig], LLMEngine] | None) -> LLMEngine:
    largest = max([*s.batch.batch_sizes, *(int(x) for x in s.loads if s.load_kind == "closed")])
    return (make or _zoo_engine)(
        EngineConfig(
            model=s.model,
            draft=s.draft,
            method=s.method,
            k=s.k,
            max_batch_size=max(64, largest),
            kv_cache_bytes=s.kv_cache_bytes,
            device=s.device,
            seed=s.seed,
            simulate_device=s.simulate_device,
            simulate_time_scale=s.simulate_time_scale,
            simulate_extra_context=s.simulate_extra_context,
            simulate_context_scale=s.simulate_context_scale,
        )
    )


def _zoo_engine(config: EngineConfig) -> LLMEngine:
    return LLMEngine(config, resolve_model=resolve_model)


async def _batch_phase(state: _Run, target: EngineTarget) -> None:
    s, engine = state.settings, target.engine
    ids = [engine.tokenizer.encode(p.text).ids for p in state.prompts]
    speculator = engine.config.draft or engine.config.method
    state.log(f"batch sweep: {engine.config.model} + {speculator}, k={engine.k}")
    sizes = sweep(engine, ids, s.batch)
    timed = []
    if engine.simulation:  # the sweep reads the modelled clock; nobody waits on the wall one
        engine.simulation.hold = False
    try:
        while batch := await target.loop.call(lambda: next(sizes, None)):
            timed += batch
            result = _batch_result(timed, s.batch, ids)
            state.update(batch_sweep=result)
            state.log(_point_line(result.points[-1]))
    finally:
        if engine.simulation:
            engine.simulation.hold = True
    sweep_result = state.result.batch_sweep
    assert sweep_result is not None
    state.log(f"crossover: {describe_crossover(sweep_result.crossover)}")
    if not engine.simulation:  # this machine's memory bound says nothing of a simulated GPU
        await _roofline(state, target, aggregate_median(timed))


def _batch_result(timed: list, settings: SweepSettings, ids: list[list[int]]) -> BatchSweep:
    curve = speedup_curve(aggregate_median(timed))
    drafted = sum(it.drafted for it in timed)
    return BatchSweep(
        iterations_per_mode=settings.iterations,
        prompt_tokens=round(sum(map(len, ids)) / len(ids)),
        points=[bucket_point(p) for p in curve],
        crossover=crossover_result(crossover_of(curve)),
        acceptance=round(sum(it.accepted for it in timed) / drafted, 4) if drafted else None,
    )


async def _roofline(state: _Run, target: EngineTarget, stats: StatsByBucket) -> None:
    plain = stats.get(("plain", 1))
    if plain is None or plain.step_seconds is None:
        return
    engine = target.engine
    bandwidth = await target.loop.call(lambda: copy_bandwidth(engine.device))
    weights = weight_bytes(engine.target.model)
    bound = weights / bandwidth
    state.update(
        roofline=Roofline(
            weight_bytes=weights,
            copy_bandwidth_gb_s=round(bandwidth / 1e9, 3),
            roofline_ms=round(bound * 1e3, 4),
            plain_step_ms=round(plain.step_seconds * 1e3, 4),
            ratio=round(plain.step_seconds / bound, 2),
        )
    )


async def _load_phase(state: _Run, target: Client) -> None:
    s = state.settings
    threshold, source = _known_threshold(state)
    if s.trace:
        policies = [
            (p, threshold if p == "gated" else POLICY_THRESHOLDS.get(p)) for p in s.policies
        ]
        bounds = Bounds(
            s.requests or len(s.trace.trace.requests), s.duration_s, s.request_timeout_s
        )
        await replay_policies(
            target,
            s.trace,
            policies,
            bounds,
            s.slo,
            state.log,
            lambda r: state.update(trace=r),
            s.temperature,
        )
        return
    state.update(load_sweep=_load_result(state, [], threshold, source))
    measure_first = "gated" in s.policies and source == "none"
    first = [p for p in s.policies if not (measure_first and p == "gated")]
    for level, load in enumerate(s.loads):
        await _measure_load(state, target, first, threshold, load, s.seed + 1000 * level)
    if measure_first:
        sweep_result = state.result.load_sweep
        assert sweep_result is not None
        crossover = Crossover(sweep_result.crossover.status, sweep_result.crossover.batch)
        threshold = crossover.threshold
        state.update(
            load_sweep=sweep_result.model_copy(
                update={"gated_threshold": threshold, "threshold_source": "load_sweep"}
            )
        )
        for level, load in enumerate(s.loads):
            await _measure_load(state, target, ["gated"], threshold, load, s.seed + 1000 * level)


def _known_threshold(state: _Run) -> tuple[int | None, str]:
    if state.settings.threshold is not None:
        return state.settings.threshold, "flag"
    sweep_result = state.result.batch_sweep
    if sweep_result is None:
        return None, "none"
    crossover = Crossover(sweep_result.crossover.status, sweep_result.crossover.batch)
    return crossover.threshold, "batch_sweep"


@dataclass
class _Share:
    """One policy's part of a load level, summed over its rounds."""

    policy: str
    threshold: int | None
    results: list[RequestResult] = field(default_factory=list)
    seconds: float = 0.0
    counters: list[Counters | None] = field(default_factory=list)

    def add(self, results: list[RequestResult], counters: Counters | None) -> None:
        self.results += results
        if results:
            self.seconds += max(r.done_at for r in results) - min(r.sent_at for r in results)
        self.counters.append(counters)

    def total(self) -> Counters | None:
        known = [c for c in self.counters if c is not None]
        return sum(known, NO_COUNTERS) if known and len(known) == len(self.counters) else None


async def _measure_load(
    state: _Run,
    target: Client,
    policies: list[str],
    gated: int | None,
    load: float,
    seed: int,
) -> None:
    """The policies take turns in short rounds at this load, so that other work on the
    machine, which comes and goes, falls on all of them alike, in an order that changes
    every round (with a fixed order, one run measured a policy 10% below an identical
    one); in a round every policy gets the same requests (prompts, lengths,
    arrival times), since acceptance depends on the text."""
    s = state.settings
    lengths = parse_lengths(s.output_lengths)
    shares = [_Share(p, gated if p == "gated" else POLICY_THRESHOLDS.get(p)) for p in policies]
    for turn in range(s.rounds):
        for share in turn_order(shares, turn):
            requests = random.Random(f"{seed}/{turn}/requests")
            specs = request_stream(
                _rotated(state.prompts, requests), lengths, requests, s.temperature
            )
            arrivals = random.Random(f"{seed}/{turn}/arrivals")
            await _take_turn(state, target, share, load, specs, arrivals)
            if not any(r.ok for r in share.results):
                _record(state, shares, load)
                raise BenchError(_failure(share, load))
    _record(state, shares, load)


T = TypeVar("T")


def turn_order(items: list[T], turn: int) -> list[T]:
    """The order of the policies in round `turn`: every permutation in turn, so that over
    len(items)! rounds each policy runs in each position, and after each other one,
    equally often."""
    orders = list(itertools.permutations(items))
    return list(orders[turn % len(orders)])


async def _take_turn(
    state: _Run,
    target: Client,
    share: _Share,
    load: float,
    specs: Iterator[RequestSpec],
    rng: random.Random,
) -> None:
    s = state.settings
    if share.policy != "current":
        await target.set_threshold(share.threshold)
    before = await target.counters()
    total = math.ceil(s.requests_at(load) / s.rounds)
    bounds = Bounds(total, s.duration_s / s.rounds, s.request_timeout_s)
    desc = f"{share.policy} @ {load:g}"
    with tqdm(total=total, desc=desc, unit="req", disable=None, leave=False) as bar:
        results = await run_level(
            target, Load(s.load_kind, load), specs, bounds, lambda _r: bar.update(), rng=rng
        )
    after = await target.counters()
    share.add(results, after - before if after is not None and before is not None else None)


def _rotated(prompts: list[Prompt], rng: random.Random) -> list[Prompt]:
    start = rng.randrange(len(prompts))
    return prompts[start:] + prompts[:start]


def _failure(share: _Share, load: float) -> str:
    where = f"{share.policy} load {load:g}"
    if not share.results:
        return f"no request was sent at {where} within --duration-s"
    first = next(r.error for r in share.results if r.error)
    return f"every request failed at {where}; the first error: {first}"


def _record(state: _Run, shares: list[_Share], load: float) -> None:
    s = state.settings
    sweep_result = state.result.load_sweep
    assert sweep_result is not None
    levels = list(sweep_result.levels)
    for share in (sh for sh in shares if sh.counters):  # the policies that had a turn
        counters = share.total()
        level = summarize(
            share.results,
            share.policy,
            share.threshold,
            Load(s.load_kind, load),
            s.slo,
            counters,
            share.seconds,
        )
        if counters is not None and share.policy != "gated":
            state.steps.setdefault(share.policy, []).append(counters.steps)
        levels.append(level)
        state.log(_level_line(level))
    state.update(
        load_sweep=_load_result(
            state, levels, sweep_result.gated_threshold, sweep_result.threshold_source
        )
    )


def _load_result(
    state: _Run, levels: list[LevelResult], threshold: int | None, source: str
) -> LoadSweep:
    """The load sweep so far; its crossover comes from the per-bucket steps of the
    ungated levels (never gives plain steps, always gives spec steps)."""
    s = state.settings
    curve = speedup_curve(merge(part for parts in state.steps.values() for part in parts))
    return LoadSweep(
        kind=s.load_kind,
        loads=list(s.loads),
        requests_per_level=s.requests,
        duration_s=s.duration_s,
        rounds=s.rounds,
        output_lengths=s.output_lengths,
        prompts=str(s.prompts_file) if s.prompts_file else f"shipped text, {s.prompt_len} bytes",
        slo=s.slo,
        gated_threshold=threshold,
        threshold_source=source,
        levels=levels,
        points=[bucket_point(p) for p in curve],
        crossover=crossover_result(crossover_of(curve)),
    )


def _judge(state: _Run) -> None:
    r = state.result
    if r.batch_sweep and r.load_sweep:
        a, b = (
            Crossover(x.crossover.status, x.crossover.batch) for x in (r.batch_sweep, r.load_sweep)
        )
        state.update(crossover_agreement_buckets=bucket_distance(a, b))
    if r.load_sweep is None or not {"never", "always", "gated"} <= set(state.settings.policies):
        return
    goodput: dict[str, dict[float, float]] = {}
    for level in r.load_sweep.levels:
        goodput.setdefault(level.policy, {})[level.load] = level.goodput_rps
    verdict = judge_gate(goodput, GATE_FLOOR)
    state.update(
        verdict=Verdict(
            floor=GATE_FLOOR,
            ratios=[LevelRatio(load=v.load, ratio=_round(v.ratio, 4)) for v in verdict.levels],
            min_ratio=_round(verdict.min_ratio, 4),
            totals={k: round(v, 4) for k, v in verdict.totals.items()},
            holds=verdict.holds,
        )
    )


def bucket_point(p: SpeedupPoint) -> BucketPoint:
    plain, spec = p.plain, p.spec
    assert plain.step_seconds and spec.step_seconds and plain.throughput and spec.throughput
    return BucketPoint(
        batch=p.batch,
        plain_steps=plain.steps,
        spec_steps=spec.steps,
        plain_step_ms=round(plain.step_seconds * 1e3, 4),
        spec_step_ms=round(spec.step_seconds * 1e3, 4),
        plain_tokens_per_step=round(plain.tokens / plain.steps, 4),
        spec_tokens_per_step=round(spec.tokens / spec.steps, 4),
        plain_tokens_per_s=round(plain.throughput, 2),
        spec_tokens_per_s=round(spec.throughput, 2),
        speedup=round(p.speedup, 4),
    )


def crossover_result(c: Crossover) -> CrossoverResult:
    crosses = c.status == "crosses" and c.batch is not None
    return CrossoverResult(
        status=c.status,
        batch=None if c.batch is None else round(c.batch, 3),
        bucket=batch_bucket(max(1, math.floor(c.batch))) if crosses else None,
        threshold=None if c.status == "unknown" else c.threshold,
    )


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def _point_line(p: BucketPoint) -> str:
    return (
        f"  batch {p.batch:>3}: plain {p.plain_step_ms:7.2f} ms/step, spec {p.spec_step_ms:7.2f} "
        f"ms/step for {p.spec_tokens_per_step:.2f} tokens -> speedup {p.speedup:.2f}"
    )


def _level_line(v: LevelResult) -> str:
    acceptance = "-" if v.acceptance is None else f"{v.acceptance:.2f}"
    batch = "-" if v.mean_batch is None else f"{v.mean_batch:.1f}"
    return (
        f"  {v.policy:<6} load {v.load:>5g}: {v.ok}/{v.requests} ok, goodput {v.goodput_rps:.3f} "
        f"req/s, {v.output_tokens_per_s:.0f} tok/s, TPOT p50 {v.tpot_ms.p50} ms, "
        f"acceptance {acceptance}, mean batch {batch}"
    )
