"""The demo's load, from the bench's load generator: closed-loop clients that spread their
requests over whichever engine pods are ready, and the counterfactual runs of the fixed
policies on an engine of the phase's SKU of its own.

Bounded like every load here: a fixed number of clients, each request with a timeout, and
nothing sent after `stop()`."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from spectune.engine.bench.loadgen import (
    NO_COUNTERS,
    Bounds,
    Counters,
    Load,
    RequestResult,
    run_level,
)
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


@dataclass(frozen=True)
class PolicyRun:
    """One policy's counterfactual run."""

    goodput_rps: float  # SLO-met requests per wall-clock second
    overrun_percent: float  # iterations this CPU ran past the modelled clock per 100 decode steps
    # decode tokens per second of the modelled GPU, on its clock unslowed: what speculation
    # changes, whatever this CPU's overruns did to the wall clock
    gpu_tokens_per_s: float


class Fleet:
    """Closed-loop clients over the current pods; `tick()` says what happened since the last."""

    def __init__(self, slo: Slo) -> None:
        self.slo = slo
        self.urls: list[str] = []
        self.temperature = 0.0
        self.targets: dict[str, HttpTarget] = {}
        self.results: list[RequestResult] = []
        self.workers: list[asyncio.Task[None]] = []
        self.counters: dict[str, Counters] = {}
        self._next = itertools.count()
        self._since = time.perf_counter()

    async def target(self, url: str) -> HttpTarget:
        if url not in self.targets:
            self.targets[url] = await HttpTarget(url, None, None, REQUEST_TIMEOUT_S).__aenter__()
        return self.targets[url]

    async def set(self, urls: list[str], clients: int, temperature: float) -> None:
        """Point the clients at these pods, with this many clients sampling at `temperature`."""
        self.urls, self.temperature = urls, temperature
        while len(self.workers) < clients:
            self.workers.append(asyncio.create_task(self._client(len(self.workers))))
        while len(self.workers) > clients:
            self.workers.pop().cancel()

    async def _client(self, i: int) -> None:
        specs = requests(self.temperature, f"client/{i}")
        temperature = self.temperature
        while True:
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
        batch, overrun = {}, {}
        for sku, deltas in by_sku.items():
            batches = [b for d in deltas if (b := d.mean_batch) is not None]
            if batches:
                batch[sku] = round(sum(batches) / len(batches), 1)
            total = sum(deltas, NO_COUNTERS)
            if total.decode_steps:
                overrun[sku] = round(100 * total.overruns / total.decode_steps, 1)
        return Tick(met / seconds if seconds > 0 else 0.0, len(done), batch, overrun)

    async def stop(self) -> None:
        for w in self.workers:
            w.cancel()
        await asyncio.gather(*self.workers, return_exceptions=True)
        self.workers = []
        for t in self.targets.values():
            await t.__aexit__()
        self.targets = {}


class Shadow:
    """One engine outside the cluster, run as the pods run theirs (same model, method, k and
    simulated SKU clock), for the counterfactual policies: the operator never sees it."""

    def __init__(self, sku: str, time_scale: float, out: Path, pid_dir: Path) -> None:
        self.time_scale = time_scale
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = os.urandom(16).hex()
        token_file = out / f"shadow-{self.port}.token"
        token_file.write_text(self.token)
        token_file.chmod(0o600)
        engine = str(Path(sys.executable).with_name("spectune-engine"))
        cmd = [
            engine,
            "serve",
            "--model",
            "tiny-target",
            "--method",
            "ngram",
            "--k",
            "16",
            "--max-batch-size",
            "96",
            "--max-queue",
            "512",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--admin-token-file",
            str(token_file),
            "--simulate-device",
            sku,
            "--simulate-time-scale",
            f"{time_scale:g}",
        ]
        log = (out / f"shadow-{self.port}.log").open("w")
        self.process = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.pid_file = pid_dir / f"demo-shadow-{self.port}.pid"  # for `make demo-down`
        self.pid_file.write_text(str(self.process.pid))

    async def ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the counterfactual engine exited ({self.process.returncode})")
            with contextlib.suppress(Exception):
                async with HttpTarget(self.url, None, None, 5) as t:
                    await t.threshold()
                    return
            await asyncio.sleep(1)
        raise RuntimeError(f"the counterfactual engine at {self.url} was not ready in time")

    async def goodput(
        self,
        threshold: int | None,
        levels: list[int],
        temperature: float,
        seconds: float,
        slo: Slo,
    ) -> PolicyRun:
        """The engine at `threshold` under closed-loop clients, each level's count in turn for
        `seconds` after a short warm-up at that load (its first requests all arrive at once):
        equal time per level, as the phase's waves had. The modelled throughput is each
        level's, averaged: pooled, a policy whose steps this CPU slowed would weigh its levels
        differently from one it did not."""
        met, window, measured, per_level = 0, 0.0, NO_COUNTERS, []
        async with HttpTarget(self.url, None, self.token, REQUEST_TIMEOUT_S) as target:
            await target.set_threshold(threshold)
            specs = requests(temperature, f"counterfactual/{levels}/{temperature}")
            for clients in levels:
                load = Load("closed", clients)
                warm_up = Bounds(10**6, seconds / 4, REQUEST_TIMEOUT_S)
                await run_level(target, load, specs, warm_up)
                before, began = await target.counters(), time.perf_counter()
                results = await run_level(
                    target, load, specs, Bounds(10**6, seconds, REQUEST_TIMEOUT_S)
                )
                window += time.perf_counter() - began
                met += sum(r.meets(slo) for r in results)
                after = await target.counters()
                if before is not None and after is not None:
                    level = after - before
                    measured = measured + level
                    busy = sum(m.seconds for m in level.steps.values())
                    tokens = sum(m.tokens for m in level.steps.values())
                    per_level.append(tokens / busy * self.time_scale if busy else 0.0)
        steps = measured.decode_steps
        return PolicyRun(
            goodput_rps=met / window,
            overrun_percent=100 * measured.overruns / steps if steps else 0.0,
            gpu_tokens_per_s=sum(per_level) / len(per_level) if per_level else 0.0,
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
