"""The demo's load, from the bench's load generator: closed-loop clients that spread their
requests over whichever engine pods are ready, and what the engines' own counters say they
ran.

Bounded like every load here: a fixed number of clients, each request with a timeout, and
nothing sent after `stop()`."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

from spectune.engine.bench.loadgen import NO_COUNTERS, Counters, RequestResult
from spectune.engine.bench.loadgen import run_request as send
from spectune.engine.bench.schema import Slo
from spectune.engine.bench.targets import HttpTarget
from spectune.engine.bench.workload import Prompt, RequestSpec, parse_lengths, request_stream
from spectune.engine.bench.workload import shipped_prompts as prompts_of

OUTPUT_TOKENS = "24"
REQUEST_TIMEOUT_S = 120.0


@functools.cache
def prompts() -> tuple[Prompt, ...]:
    """Held-out code prompts (the models never trained on them): read once, as reading the
    corpus takes long enough to stall every client sharing the event loop."""
    return tuple(prompts_of(64, 64))


def requests(temperature: float, seed: str) -> Iterator[RequestSpec]:
    """The held-out prompts in an order of the seed's, 24 tokens each."""
    rng = random.Random(seed)
    shuffled = list(prompts())
    rng.shuffle(shuffled)
    return request_stream(shuffled, parse_lengths(OUTPUT_TOKENS), rng, temperature)


@dataclass(frozen=True)
class Tick:
    goodput_rps: float  # SLO-met requests per second
    requests: int  # answered
    batch: dict[str, float]  # SKU -> mean running batch
    overrun_percent: dict[str, float]  # SKU -> iterations the CPU ran past the clock per 100 steps
    counters: dict[str, Counters]  # SKU -> what its engines ran since the last tick, summed


class Fleet:
    """Closed-loop clients over the current pods; `tick()` says what happened since the last."""

    def __init__(self, slo: Slo) -> None:
        self.slo = slo
        self.urls: list[str] = []
        self.temperature = 0.0
        self.targets: dict[str, HttpTarget] = {}
        self.results: list[RequestResult] = []
        self.clients = 0
        self.workers: dict[int, asyncio.Task[None]] = {}
        self.counters: dict[str, Counters] = {}
        self._next = itertools.count()
        self._since = time.perf_counter()

    async def target(self, url: str) -> HttpTarget:
        if url not in self.targets:
            self.targets[url] = await HttpTarget(url, None, None, REQUEST_TIMEOUT_S).__aenter__()
        return self.targets[url]

    async def set(self, urls: list[str], clients: int, temperature: float) -> None:
        """Point the clients at these pods, with this many clients sampling at `temperature`.
        Clients past the number finish the request they are on, then stop: one cut off would
        count on its engine as an error (the client went away), a failure of no policy's."""
        self.urls, self.temperature, self.clients = urls, temperature, clients
        for i in range(clients):
            if i not in self.workers or self.workers[i].done():
                self.workers[i] = asyncio.create_task(self._client(i))

    async def _client(self, i: int) -> None:
        specs = requests(self.temperature, f"client/{i}")
        temperature = self.temperature
        while i < self.clients:
            if not self.urls:
                await asyncio.sleep(0.5)
                continue
            if temperature != self.temperature:  # the traffic shifted
                specs, temperature = requests(self.temperature, f"client/{i}"), self.temperature
            url = self.urls[next(self._next) % len(self.urls)]
            try:
                target = await self.target(url)
            except Exception:  # the pod went away between the listing and now
                await asyncio.sleep(1)
                continue
            result = await send(target, next(specs), time.perf_counter, REQUEST_TIMEOUT_S)
            self.results.append(result)
            if result.error:
                await asyncio.sleep(0.5)

    async def tick(self, skus: dict[str, str]) -> Tick:
        """What happened since the last tick; batches and overruns from each engine's own
        counters."""
        now = time.perf_counter()
        done, self.results = self.results, []
        seconds, self._since = now - self._since, now
        met = sum(r.meets(self.slo) for r in done)
        by_sku: dict[str, list[Counters]] = {}
        for url, sku in skus.items():
            with contextlib.suppress(Exception):
                current = await (await self.target(url)).counters()
                before = self.counters.get(url)
                if current is not None:
                    self.counters[url] = current
                if current is not None and before is not None:
                    by_sku.setdefault(sku, []).append(current - before)
        batch, overrun, totals = {}, {}, {}
        for sku, deltas in by_sku.items():
            batches = [b for d in deltas if (b := d.mean_batch) is not None]
            if batches:
                batch[sku] = round(sum(batches) / len(batches), 1)
            totals[sku] = total = sum(deltas, NO_COUNTERS)
            if total.decode_steps:
                overrun[sku] = round(100 * total.overruns / total.decode_steps, 1)
        return Tick(met / seconds if seconds > 0 else 0.0, len(done), batch, overrun, totals)

    async def stop(self) -> None:
        for w in self.workers.values():
            w.cancel()
        await asyncio.gather(*self.workers.values(), return_exceptions=True)
        self.workers = {}
        for t in self.targets.values():
            await t.__aexit__()
        self.targets = {}
