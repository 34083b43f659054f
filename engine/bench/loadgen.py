"""Load generation: closed loop (a fixed number of clients, each sending its next request
when the last one finishes) and open loop (Poisson arrivals at a rate), bounded in
request count and time, against any `Client`: an OpenAI-compatible URL or the
in-process engine. Every request is timed from the client's side the same way
(TTFT, gaps between streamed chunks, end to end) so the two targets compare.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

from spectune.engine.bench.schema import Latency, LevelResult, Slo
from spectune.engine.bench.workload import RequestSpec
from spectune.engine.crossover import StatsByBucket, difference, merge
from spectune.engine.request_timing import RequestTiming

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class RequestFailed(Exception):
    """One request failed; the message says why in one line."""


@dataclass(frozen=True)
class Output:
    """A streamed chunk of output arrived."""


@dataclass(frozen=True)
class Finished:
    output_tokens: int


@dataclass(frozen=True)
class Counters:
    """Cumulative engine-side counters, read before and after a level."""

    steps: StatsByBucket
    drafted: int
    accepted: int
    decode_steps: int
    batch_sum: float
    # iterations a simulated SKU's engine ran longer than the modelled GPU would (its clock
    # was not faithful there); 0 off a simulated SKU
    overruns: int = 0

    def __add__(self, other: Counters) -> Counters:
        return Counters(
            merge([self.steps, other.steps]),
            self.drafted + other.drafted,
            self.accepted + other.accepted,
            self.decode_steps + other.decode_steps,
            self.batch_sum + other.batch_sum,
            self.overruns + other.overruns,
        )

    def __sub__(self, before: Counters) -> Counters:
        return Counters(
            difference(self.steps, before.steps),
            self.drafted - before.drafted,
            self.accepted - before.accepted,
            self.decode_steps - before.decode_steps,
            self.batch_sum - before.batch_sum,
            self.overruns - before.overruns,
        )

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_batch(self) -> float | None:
        return self.batch_sum / self.decode_steps if self.decode_steps else None


NO_COUNTERS = Counters({}, 0, 0, 0, 0.0)


class Client(Protocol):
    """A target the load generator can drive and, for the policy sweep, reconfigure."""

    max_model_len: int | None  # context + output tokens it takes, when known

    def stream(self, spec: RequestSpec) -> AsyncIterator[Output | Finished]:
        """Output per streamed chunk, then Finished; raises RequestFailed."""
        ...

    async def set_threshold(self, threshold: int | None) -> None: ...

    async def counters(self) -> Counters | None: ...

    async def threshold(self) -> int | None:
        """The threshold in force (None: always speculate), for a replay's report; raises
        BenchError when the target does not say."""
        ...


@dataclass(frozen=True)
class RequestResult:
    sent_at: float
    done_at: float
    ttft: float | None = None
    output_tokens: int = 0
    itl: tuple[float, ...] = ()
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def timing(self) -> RequestTiming | None:
        if not self.ok or self.ttft is None:
            return None
        return RequestTiming(self.ttft, self.done_at - self.sent_at, self.output_tokens)

    def meets(self, slo: Slo) -> bool:
        timing = self.timing()
        return timing is not None and timing.meets(slo.ttft_ms / 1e3, slo.tpot_ms / 1e3)


@dataclass(frozen=True)
class Load:
    kind: Literal["closed", "open"]
    value: float  # clients (closed) or requests per second (open)


@dataclass(frozen=True)
class Bounds:
    requests: int  # per level
    duration_s: float  # no request is sent after this
    request_timeout_s: float


async def run_request(
    client: Client, spec: RequestSpec, clock: Clock, timeout: float
) -> RequestResult:
    sent = clock()
    first = last = None
    gaps: list[float] = []
    tokens = None
    try:
        async with asyncio.timeout(timeout):
            async for event in client.stream(spec):
                now = clock()
                if isinstance(event, Finished):
                    tokens = event.output_tokens
                    continue
                if first is None:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
    except RequestFailed as err:
        return RequestResult(sent, clock(), error=str(err))
    except TimeoutError:
        return RequestResult(sent, clock(), error=f"no complete answer within {timeout:g} s")
    if first is None:
        return RequestResult(sent, clock(), error="the answer streamed no output")
    if tokens is None:
        return RequestResult(sent, clock(), error="the stream ended without a usage count")
    return RequestResult(sent, clock(), first - sent, tokens, tuple(gaps))


async def run_level(
    client: Client,
    load: Load,
    specs: Iterator[RequestSpec],
    bounds: Bounds,
    on_result: Callable[[RequestResult], None] = lambda _r: None,
    clock: Clock = time.perf_counter,
    sleep: Sleep = asyncio.sleep,
    rng: random.Random | None = None,
) -> list[RequestResult]:
    """Run one load level to completion; results in completion order."""
    results: list[RequestResult] = []

    async def one(spec: RequestSpec) -> None:
        result = await run_request(client, spec, clock, bounds.request_timeout_s)
        results.append(result)
        on_result(result)

    deadline = clock() + bounds.duration_s
    if load.kind == "closed":
        await _closed(int(load.value), specs, bounds.requests, deadline, clock, one)
    else:
        await _open(load.value, specs, bounds.requests, deadline, clock, sleep, rng, one)
    return results


async def _closed(
    clients: int,
    specs: Iterator[RequestSpec],
    total: int,
    deadline: float,
    clock: Clock,
    one: Callable[[RequestSpec], Awaitable[None]],
) -> None:
    sent = 0

    async def worker() -> None:
        nonlocal sent
        while sent < total and clock() < deadline:
            sent += 1
            await one(next(specs))

    await asyncio.gather(*(worker() for _ in range(clients)))


async def _open(
    rate: float,
    specs: Iterator[RequestSpec],
    total: int,
    deadline: float,
    clock: Clock,
    sleep: Sleep,
    rng: random.Random | None,
    one: Callable[[RequestSpec], Awaitable[None]],
) -> None:
    """Exponential gaps between arrivals."""
    rng = rng or random.Random(0)
    times = itertools.accumulate(rng.expovariate(rate) for _ in range(total))
    start = clock()
    await send_at(((start + t, next(specs)) for t in times), deadline, clock, sleep, one)


T = TypeVar("T")


async def send_at(
    arrivals: Iterable[tuple[float, T]],
    deadline: float,
    clock: Clock,
    sleep: Sleep,
    one: Callable[[T], Awaitable[None]],
) -> None:
    """Open loop: each request is sent at its time on `clock` whatever is in flight, so a
    slow server never slows the arrivals; none is sent after `deadline`."""
    tasks = []
    for at, request in arrivals:
        if at > deadline:
            break
        await sleep(max(0.0, at - clock()))
        tasks.append(asyncio.create_task(one(request)))
    await asyncio.gather(*tasks)


def _window(results: list[RequestResult]) -> float:
    return max(r.done_at for r in results) - min(r.sent_at for r in results) if results else 0.0


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between closest ranks like numpy's default."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_ms(values: list[float]) -> Latency:
    ms = {f"p{q}": percentile(values, q) for q in (50, 90, 99)}
    return Latency(**{k: None if v is None else round(v * 1e3, 3) for k, v in ms.items()})


def summarize(
    results: list[RequestResult],
    policy: str,
    threshold: int | None,
    load: Load,
    slo: Slo,
    counters: Counters | None,
    seconds: float | None = None,
) -> LevelResult:
    """One level's numbers over `seconds` of measurement, by default from the first send to
    the last answer, so goodput and throughput include the ramp and tail the level had."""
    ok = [r for r in results if r.ok]
    timings = [t for r in ok if (t := r.timing()) is not None]
    window = seconds if seconds is not None else _window(results)
    per_s = 1 / window if window > 0 else 0.0
    met = sum(r.meets(slo) for r in results)
    errors = [r.error for r in results if r.error]
    return LevelResult(
        policy=policy,
        threshold=threshold,
        load=load.value,
        requests=len(results),
        ok=len(ok),
        errors=len(errors),
        first_error=errors[0] if errors else None,
        seconds=round(window, 4),
        output_tokens=sum(r.output_tokens for r in ok),
        output_tokens_per_s=round(sum(r.output_tokens for r in ok) * per_s, 3),
        goodput_rps=round(met * per_s, 4),
        request_rps=round(len(ok) * per_s, 4),
        slo_met=met,
        ttft_ms=latency_ms([t.ttft for t in timings]),
        itl_ms=latency_ms([g for r in ok for g in r.itl]),
        tpot_ms=latency_ms([tp for t in timings if (tp := t.tpot) is not None]),
        e2e_ms=latency_ms([t.e2e for t in timings]),
        acceptance=None if counters is None else counters.acceptance,
        mean_batch=None if counters is None else counters.mean_batch,
    )
