"""The load generator against the in-process engine: closed and open loop, bounds in count
and time, timeouts, and the per-level numbers."""

from __future__ import annotations

import asyncio
import random
import time
from itertools import accumulate

import pytest

from spectune.engine.bench.loadgen import (
    Bounds,
    Load,
    RequestResult,
    percentile,
    run_level,
    summarize,
)
from spectune.engine.bench.schema import Slo
from spectune.engine.bench.targets import EngineTarget
from spectune.engine.bench.workload import RequestSpec

SLO = Slo(ttft_ms=1000, tpot_ms=100)


def specs(tokens: int = 8):
    while True:
        yield RequestSpec("def main():\n    ", tokens)


def drive(engine, load: Load, bounds: Bounds, **kw):
    async def go():
        async with EngineTarget(engine) as target:
            before = await target.counters()
            results = await run_level(target, load, specs(), bounds, **kw)
            counters = (await target.counters()) - before
        return results, counters, engine.has_work()  # abandoned requests are cancelled by now

    return asyncio.run(go())


def test_closed_loop_keeps_concurrency_and_count(tiny_engine) -> None:
    results, counters, busy = drive(tiny_engine, Load("closed", 2), Bounds(6, 60, 60))
    assert len(results) == 6 and all(r.ok for r in results)
    assert all(r.output_tokens == 8 and 0 < r.ttft < r.done_at - r.sent_at for r in results)
    assert counters.mean_batch is not None and 1 <= counters.mean_batch <= 2
    assert counters.acceptance is not None and 0 < counters.acceptance <= 1
    assert not busy


def test_closed_loop_stops_sending_at_the_time_bound(tiny_engine) -> None:
    results, _, _ = drive(tiny_engine, Load("closed", 2), Bounds(100, 0.0, 60))
    assert results == []


def test_open_loop_sends_poisson_arrivals_until_the_time_bound(tiny_engine) -> None:
    gaps = random.Random(7)
    arrivals = list(accumulate(gaps.expovariate(4.0) for _ in range(100)))
    expected = sum(1 for t in arrivals if t <= 1.0)
    results, _, _ = drive(
        tiny_engine, Load("open", 4.0), Bounds(100, 1.0, 60), rng=random.Random(7)
    )
    assert len(results) == expected and all(r.ok for r in results)


def test_a_timed_out_request_is_an_error_and_frees_the_engine(tiny_engine) -> None:
    results, _, busy = drive(tiny_engine, Load("closed", 1), Bounds(1, 60, 0.001))
    assert results[0].error == "no complete answer within 0.001 s"
    assert not busy


def test_leaving_the_target_waits_for_a_request_that_timed_out_while_queueing(tiny_engine) -> None:
    """The submit is still behind a slow command when the level ends; it is cancelled anyway."""

    async def go():
        async with EngineTarget(tiny_engine) as target:
            stall = asyncio.ensure_future(target.loop.call(lambda: time.sleep(0.5)))
            results = await run_level(target, Load("closed", 1), specs(), Bounds(1, 60, 0.01))
            assert not stall.done()
        return results

    results = asyncio.run(go())
    assert results[0].error == "no complete answer within 0.01 s"
    assert not tiny_engine.has_work()


def test_the_engine_keeps_serving_after_a_request_gave_up_while_queueing(tiny_engine) -> None:
    """A caller cancelled before its command ran must not take the engine loop down."""

    async def go():
        async with EngineTarget(tiny_engine) as target:
            gave_up = await run_level(target, Load("closed", 4), specs(), Bounds(4, 60, 1e-6))
            served = await run_level(target, Load("closed", 2), specs(), Bounds(2, 60, 60))
            return gave_up, served

    gave_up, served = asyncio.run(go())
    assert not any(r.ok for r in gave_up)
    assert [r.ok for r in served] == [True, True]
    assert not tiny_engine.has_work()


def test_a_call_cancelled_before_it_ran_runs_nothing_and_the_loop_lives_on(tiny_engine) -> None:
    ran: list[int] = []

    async def go():
        async with EngineTarget(tiny_engine) as target:
            busy = asyncio.ensure_future(target.loop.call(lambda: time.sleep(0.2)))
            await asyncio.sleep(0.05)  # the loop thread is inside the first command now
            gone = asyncio.ensure_future(target.loop.call(lambda: ran.append(1)))
            await asyncio.sleep(0)  # queued
            gone.cancel()
            await busy
            return await asyncio.wait_for(target.loop.call(lambda: 42), 5)

    assert asyncio.run(go()) == 42
    assert ran == []


def test_summarize_counts_goodput_within_the_slo() -> None:
    fast = RequestResult(0.0, 1.0, ttft=0.1, output_tokens=10, itl=(0.1,) * 9)
    slow = RequestResult(0.0, 4.0, ttft=0.1, output_tokens=10, itl=(0.4,) * 9)  # TPOT 433 ms
    failed = RequestResult(1.0, 2.0, error="HTTP 500: boom")
    level = summarize([fast, slow, failed], "gated", 4, Load("closed", 2), SLO, None)
    assert (level.requests, level.ok, level.errors, level.slo_met) == (3, 2, 1, 1)
    assert level.first_error == "HTTP 500: boom"
    assert level.seconds == 4.0
    assert level.goodput_rps == pytest.approx(0.25)
    assert level.output_tokens_per_s == pytest.approx(5.0)
    assert level.ttft_ms.p50 == pytest.approx(100)
    assert level.tpot_ms.p99 == pytest.approx(430.0)  # 100 and 433: p99 interpolates
    assert level.acceptance is None and level.mean_batch is None


def test_summarize_an_empty_level() -> None:
    level = summarize([], "never", 0, Load("open", 1.0), SLO, None)
    assert level.requests == 0 and level.goodput_rps == 0 and level.ttft_ms.p50 is None


def test_percentile_matches_linear_interpolation() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([float(x) for x in range(101)], 90) == 90.0
