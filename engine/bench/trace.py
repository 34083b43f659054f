"""Replay of a recorded request trace through the load generator.

Each request is sent at its recorded offset, compressed by a speed factor, open loop (a
slow server does not slow the arrivals: `loadgen.send_at`). Its context and output
lengths are multiplied by a scale factor and then clipped to what the served model
holds; clipping is counted and reported, never silent. Prompt text is not part of a
trace, so prompts of the recorded length are cut from held-out standard-library text.
The replay is reported per window of trace time (arrivals, running batch, goodput,
threshold, TTFT/TPOT), since real traffic swings in rate and mix and that is when the
crossover moves.

The project ships one trace, `azure-conv` (traces/README.md: its source and license).
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Literal

from tqdm import tqdm

from spectune.engine.bench.loadgen import (
    Bounds,
    Client,
    Clock,
    Counters,
    Load,
    RequestResult,
    Sleep,
    run_request,
    send_at,
    summarize,
)
from spectune.engine.bench.schema import LevelResult, Slo, TraceReplay, TraceRun, TraceWindow
from spectune.engine.bench.trace_file import Trace
from spectune.engine.bench.workload import BenchError, RequestSpec


@dataclass(frozen=True)
class TraceSettings:
    """`speed`: trace seconds per wall-clock second; `scale`: factor on both lengths;
    `max_len`: the context length to fit into when the target does not report one (or a
    smaller one); `windows`: how many equal windows the report splits the replay into."""

    trace: Trace
    speed: float = 1.0
    scale: float = 1.0
    max_len: int | None = None
    windows: int = 12

    def __post_init__(self) -> None:
        if not (0 < self.speed < math.inf and 0 < self.scale < math.inf):
            raise BenchError("--trace-speed and --trace-scale must be positive numbers")
        if self.max_len is not None and self.max_len < 2:
            raise BenchError("--trace-max-len must be at least 2 (one prompt and one output token)")
        if self.windows < 1:
            raise BenchError("a trace replay needs at least one report window")


@dataclass(frozen=True)
class TraceRequest:
    """A request as the replay sends it."""

    at_s: float  # trace time
    prompt_tokens: int
    max_tokens: int
    clipped_context: bool = False
    clipped_output: bool = False


def fit(trace: Trace, scale: float, max_len: int) -> list[TraceRequest]:
    """Both lengths x `scale` (rounded, at least 1), then clipped so that context + output
    fit in `max_len`: the output keeps its length where it can, since decode work is what
    moves the crossover, and the context gives way; an output over max_len - 1 is cut too."""
    requests = []
    for r in trace.requests:
        context = max(1, round(r.context_tokens * scale))
        output = max(1, round(r.generated_tokens * scale))
        cut_output = output > max_len - 1
        output = min(output, max_len - 1)
        cut_context = context + output > max_len
        context = min(context, max_len - output)
        requests.append(TraceRequest(r.offset_s, context, output, cut_context, cut_output))
    return requests


def prompt_text(tokens: int, index: int) -> str:
    """`tokens` characters of held-out standard-library source (text the built-in models
    never trained on), ASCII only so that a byte-level tokenizer, the built-in models',
    reads exactly `tokens` tokens; each request starts elsewhere, since acceptance
    depends on the text."""
    text = _held_out_text()
    start = (index * 104_729) % (len(text) - tokens + 1)
    return text[start : start + tokens]


@functools.cache
def _held_out_text() -> str:
    from spectune.engine.zoo.training import corpus

    _, held_out = corpus(max_bytes=1)
    return b"\n".join(held_out).decode("ascii", "ignore")


@dataclass(frozen=True)
class Slice:
    """The part of a trace a replay sends, within the bench's count and time bounds."""

    requests: tuple[TraceRequest, ...]
    end_s: float  # trace time the slice covers, from the first request
    stopped_by: Literal["end", "requests", "duration"]


def slice_of(requests: Sequence[TraceRequest], speed: float, bounds: Bounds) -> Slice:
    due = tuple(r for r in requests[: bounds.requests] if r.at_s / speed <= bounds.duration_s)
    if len(due) < min(bounds.requests, len(requests)):
        chosen = Slice(due, bounds.duration_s * speed, "duration")
    elif len(due) < len(requests):
        chosen = Slice(due, requests[len(due)].at_s, "requests")
    else:
        chosen = Slice(due, due[-1].at_s, "end")
    if not due or chosen.end_s <= 0:
        raise BenchError(
            "the replayed slice of the trace spans no time; raise --requests or --duration-s"
        )
    return chosen


@dataclass(frozen=True)
class Sample:
    """The target's state at a window boundary."""

    counters: Counters | None
    thresholds: tuple[int | None, ...]  # () when the target does not report it


@dataclass(frozen=True)
class Replay:
    start: float  # on the clock
    results: list[RequestResult]  # in trace order
    samples: list[Sample]  # at the start, at every window boundary, at the slice's end


async def replay(
    client: Client,
    part: Slice,
    prompts: Sequence[str],
    speed: float,
    windows: int,
    timeout_s: float,
    on_result: Callable[[RequestResult], None] = lambda _r: None,
    clock: Clock = time.perf_counter,
    sleep: Sleep = asyncio.sleep,
    temperature: float = 0.0,
) -> Replay:
    """Send every request of `part` at start + its trace time / `speed` (prompts[i] for
    request i, sampled at `temperature`), and sample the target at each window boundary
    while it runs."""
    results: list[RequestResult | None] = [None] * len(part.requests)

    async def one(item: tuple[int, RequestSpec]) -> None:
        index, spec = item
        results[index] = result = await run_request(client, spec, clock, timeout_s)
        on_result(result)

    start = clock()
    arrivals = (
        (start + r.at_s / speed, (i, RequestSpec(prompts[i], r.max_tokens, temperature)))
        for i, r in enumerate(part.requests)
    )
    boundaries = [start + part.end_s / speed * w / windows for w in range(windows + 1)]
    _, samples = await asyncio.gather(
        send_at(arrivals, math.inf, clock, sleep, one), _sample(client, boundaries, clock, sleep)
    )
    assert all(r is not None for r in results)
    return Replay(start, [r for r in results if r is not None], samples)


async def _sample(client: Client, times: list[float], clock: Clock, sleep: Sleep) -> list[Sample]:
    samples = []
    for at in times:
        await sleep(max(0.0, at - clock()))
        try:
            thresholds: tuple[int | None, ...] = (await client.threshold(),)
        except BenchError:
            thresholds = ()
        samples.append(Sample(await client.counters(), thresholds))
    return samples


def report_windows(
    run: Replay, part: Slice, speed: float, windows: int, policy: str, slo: Slo
) -> list[TraceWindow]:
    """Requests belong to the window they were due in; the running batch is the target's
    own between the window's boundaries."""
    width = part.end_s / windows
    groups: list[list[RequestResult]] = [[] for _ in range(windows)]
    for request, result in zip(part.requests, run.results, strict=True):
        groups[min(windows - 1, int(request.at_s / width))].append(result)
    rows = []
    for w, group in enumerate(groups):
        before, after = run.samples[w], run.samples[w + 1]
        level = summarize(
            group,
            policy,
            None,
            Load("open", len(group) / (width / speed)),
            slo,
            _between(before.counters, after.counters),
            width / speed,
        )
        rows.append(
            TraceWindow(
                start_s=round(w * width, 3),
                seconds=round(width / speed, 4),
                arrivals=level.requests,
                ok=level.ok,
                slo_met=level.slo_met,
                goodput_rps=level.goodput_rps,
                mean_batch=None if level.mean_batch is None else round(level.mean_batch, 3),
                thresholds=list(dict.fromkeys(before.thresholds + after.thresholds)),
                ttft_ms=level.ttft_ms,
                tpot_ms=level.tpot_ms,
            )
        )
    return rows


def _between(before: Counters | None, after: Counters | None) -> Counters | None:
    return after - before if before is not None and after is not None else None


async def replay_policies(
    target: Client,
    settings: TraceSettings,
    policies: Sequence[tuple[str, int | None]],
    bounds: Bounds,
    slo: Slo,
    log: Callable[[str], None],
    update: Callable[[TraceReplay], None],
    temperature: float = 0.0,
) -> TraceReplay:
    """The bench's load phase for a trace: the same slice, the same prompts, under each
    (policy, threshold) in turn ('current' leaves the target's threshold alone). A trace
    records no sampling settings: every request samples at `temperature` (0: greedy; sampled
    text accepts fewer drafted tokens, which moves the crossover). `update` receives the
    result after every policy, so a failure keeps what was measured."""
    s = settings
    limits = [x for x in (target.max_model_len, s.max_len) if x is not None]
    if not limits:
        raise BenchError(
            "the server does not report its context length (max_model_len in /v1/models); "
            "pass --trace-max-len"
        )
    part = slice_of(fit(s.trace, s.scale, min(limits)), s.speed, bounds)
    prompts = [prompt_text(r.prompt_tokens, i) for i, r in enumerate(part.requests)]
    result = TraceReplay(
        source=s.trace.source,
        trace_requests=len(s.trace.requests),
        requests=len(part.requests),
        stopped_by=part.stopped_by,
        trace_seconds=round(part.end_s, 3),
        speed=s.speed,
        scale=s.scale,
        max_model_len=min(limits),
        clipped_context=sum(r.clipped_context for r in part.requests),
        clipped_output=sum(r.clipped_output for r in part.requests),
        prompt_tokens_mean=round(fmean(r.prompt_tokens for r in part.requests), 2),
        output_tokens_mean=round(fmean(r.max_tokens for r in part.requests), 2),
        temperature=temperature,
        window_s=round(part.end_s / s.windows, 3),
        slo=slo,
        runs=[],
    )
    update(result)
    log(describe_replay(result))
    for policy, threshold in policies:
        if policy != "current":
            await target.set_threshold(threshold)
        before = await target.counters()
        with tqdm(
            total=len(part.requests), desc=f"trace {policy}", unit="req", disable=None
        ) as bar:
            run = await replay(
                target,
                part,
                prompts,
                s.speed,
                s.windows,
                bounds.request_timeout_s,
                lambda _r: bar.update(),
                temperature=temperature,
            )
        total = summarize(
            run.results,
            policy,
            threshold,
            Load("open", len(part.requests) / (part.end_s / s.speed)),
            slo,
            _between(before, await target.counters()),
            part.end_s / s.speed,
        )
        late = max(
            r.sent_at - run.start - q.at_s / s.speed
            for q, r in zip(part.requests, run.results, strict=True)
        )
        result = result.model_copy(
            update={
                "runs": [
                    *result.runs,
                    TraceRun(
                        total=total,
                        windows=report_windows(run, part, s.speed, s.windows, policy, slo),
                        max_late_ms=round(max(0.0, late) * 1e3, 3),
                    ),
                ]
            }
        )
        update(result)
        log(_run_line(total))
        if total.ok == 0:
            raise BenchError(
                f"every request failed replaying the trace under {policy}; "
                f"the first error: {total.first_error}"
            )
    return result


def describe_replay(r: TraceReplay) -> str:
    """One line: what was replayed and what had to be cut to fit, so clipping is never
    silent."""
    bound = {
        "end": "the whole trace",
        "requests": "cut by --requests",
        "duration": "cut by --duration-s",
    }
    return (
        f"trace {r.source}: {r.requests} of {r.trace_requests} requests "
        f"({bound[r.stopped_by]}), {r.trace_seconds:g} s of trace time at {r.speed:g}x speed; "
        f"lengths x{r.scale:g} fitted to {r.max_model_len} tokens: {r.clipped_context} "
        f"contexts and {r.clipped_output} outputs clipped; mean "
        f"{r.prompt_tokens_mean:g} prompt and {r.output_tokens_mean:g} output tokens"
        + (f", sampled at temperature {r.temperature:g}" if r.temperature else ", greedy")
    )


def _run_line(v: LevelResult) -> str:
    batch = "-" if v.mean_batch is None else f"{v.mean_batch:.1f}"
    return (
        f"  trace {v.policy}: {v.ok}/{v.requests} ok, goodput {v.goodput_rps:.3f} req/s, "
        f"{v.output_tokens_per_s:.0f} tok/s, TTFT p50 {v.ttft_ms.p50} ms, "
        f"TPOT p50 {v.tpot_ms.p50} ms, mean batch {batch}"
    )
