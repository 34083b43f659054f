"""The engine on the torch thread, and the bridge to asyncio request handlers.

Only the loop, which runs on the process's torch thread (see torch_thread.py), touches
the engine. Handlers send it commands (add a request, cancel one, change speculation
settings) that run between iterations, so a settings change is atomic and takes effect
at the next iteration. Token deltas travel back on per-request asyncio queues. All
per-request accounting (latencies, SLO, outcome) happens here, where the times are known.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

from spectune.engine.engine import Iteration, LLMEngine
from spectune.engine.request_timing import RequestTiming
from spectune.engine.sequence import SamplingParams, Sequence
from spectune.engine.serving.health import Health, poisons_the_device
from spectune.engine.serving.metrics import EngineMetrics
from spectune.engine.serving.settings import SloSettings, SpeculationSettings
from spectune.engine.torch_thread import TORCH_THREAD

log = logging.getLogger("spectune.engine")


def exit_poisoned(error: BaseException) -> None:
    """Exit at once with one line naming the error: nothing this process runs on the device
    can work again, and only a new container gets a fresh CUDA context."""
    sys.stderr.write(
        f"spectune-engine: error: the CUDA context is broken ({type(error).__name__}: "
        f"{str(error).splitlines()[0] if str(error) else ''}); exiting so that it restarts\n"
    )
    sys.stderr.flush()
    os._exit(3)


class Overloaded(Exception):
    """The admission queue is full."""


class Draining(Exception):
    """The server is shutting down and admits nothing new."""


@dataclass(frozen=True)
class Delta:
    tokens: list[int]
    finish_reason: str | None  # stop | length | error
    error: str | None = None


@dataclass(eq=False)
class RequestStream:
    """One request as its handler sees it: deltas arrive on `deltas` in order."""

    seq: Sequence
    deltas: asyncio.Queue[Delta]
    submitted_at: float
    first_token_at: float | None = None
    last_token_at: float | None = None
    output_tokens: int = 0
    done: bool = field(default=False)


class EngineLoop:
    """`clock` times requests (latencies, the SLO): the wall clock, or a simulated SKU's
    modelled clock, so that a CPU too slow to keep up with the SKU (an overrun) does not
    count against the SKU's latencies; the engine's iterations run on that clock too."""

    def __init__(
        self,
        engine: LLMEngine,
        metrics: EngineMetrics,
        speculation: SpeculationSettings,
        slo: SloSettings,
        max_queue: int,
        clock: Callable[[], float] = time.monotonic,
        health: Health | None = None,
        poisoned: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.speculation = speculation
        self.slo = slo
        self.max_queue = max_queue
        self.clock = clock
        self.health = health or Health()
        # an error that breaks the CUDA context: the process exits (the container restarts)
        self.poisoned = poisoned or exit_poisoned
        self.accepting = True
        self._commands: queue.SimpleQueue[tuple[Callable[[], Any], Future]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._streams: dict[int, RequestStream] = {}
        self._submitting = 0
        self._aio: asyncio.AbstractEventLoop | None = None
        self._running: Future | None = None
        self._last_iteration: Iteration | None = None

    # --- called from the asyncio side -------------------------------------------------

    def start(self, aio: asyncio.AbstractEventLoop) -> None:
        """Run the loop on the torch thread until stop(); one loop per process at a time
        (a second one would wait on that thread for the first to stop)."""
        self._aio = aio
        self._apply(self.speculation)
        self._running = TORCH_THREAD.submit(self._run)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._running is not None:
            wait([self._running], timeout=10)

    @property
    def queued(self) -> int:
        return len(self.engine.scheduler.waiting) + self._submitting

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run fn on the loop thread between iterations and return its result."""
        future: Future = Future()
        self._commands.put((fn, future))
        self._wake.set()
        return await asyncio.wrap_future(future)

    async def submit(self, prompt: list[int], params: SamplingParams) -> RequestStream:
        """Queue a request; raises Draining, Overloaded or the engine's InvalidRequest."""
        if not self.accepting:
            self.metrics.observe_request(None, "rejected", False)
            raise Draining("the server is shutting down")
        if self.queued >= self.max_queue:
            self.metrics.observe_request(None, "rejected", False)
            raise Overloaded(f"admission queue is full ({self.max_queue} waiting)")
        self._submitting += 1
        try:
            return await self.call(lambda: self._add(prompt, params))
        finally:
            self._submitting -= 1

    async def cancel(self, stream: RequestStream, outcome: str) -> None:
        """End a request early: a stop string matched (ok) or the client went away (error)."""
        await self.call(lambda: self._end(stream, outcome))

    async def set_speculation(self, settings: SpeculationSettings) -> None:
        await self.call(lambda: self._apply(settings))

    async def drain(self, timeout: float) -> None:
        """Admit nothing new; wait up to `timeout` s for running requests, then end the rest."""
        self.accepting = False
        deadline = time.monotonic() + timeout
        while self._streams and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for stream in list(self._streams.values()):
            await self.call(lambda s=stream: self._fail(s, "the server shut down before finishing"))

    # --- the loop thread ---------------------------------------------------------------

    def _add(self, prompt: list[int], params: SamplingParams) -> RequestStream:
        seq = self.engine.add_request(prompt, params)
        stream = RequestStream(seq, asyncio.Queue(), self.clock())
        self._streams[seq.seq_id] = stream
        return stream

    def _apply(self, settings: SpeculationSettings) -> None:
        settings = settings.on_device(self.engine.device_label)  # this SKU's threshold
        self.engine.gate.settings = settings.gate()
        self.engine.k = settings.k
        self.speculation = settings
        self.metrics.set_speculation(settings.threshold, self.engine.gate.exploration())

    def _run(self) -> None:
        while not self._stop.is_set():
            self._run_commands()
            if not self.engine.has_work():
                self._publish_state()
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            self.health.started()
            try:
                self._step()
            except Exception as err:
                self.health.failed(err)
                self.metrics.iteration_failures.inc()
                if poisons_the_device(err):
                    self.poisoned(err)
                log.exception("engine iteration failed; failing its requests")
                for stream in list(self._streams.values()):
                    self._fail(stream, f"engine error: {err}")
            else:
                self.health.finished()

    def _run_commands(self) -> None:
        while True:
            try:
                fn, future = self._commands.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue  # its caller was cancelled (client gone): run nothing, answer no one
            try:
                future.set_result(fn())
            except Exception as err:
                future.set_exception(err)

    def _step(self) -> None:
        updates = self.engine.step()
        now = self.clock()
        iteration = self.engine.iterations[-1] if self.engine.iterations else None
        if iteration is not None and iteration is not self._last_iteration:
            self._last_iteration = iteration
            self.metrics.observe_iteration(iteration)
        outbox: list[tuple[RequestStream, Delta]] = []
        for update in updates:
            stream = self._streams.get(update.seq.seq_id)
            if stream is None or not update.new_tokens:
                continue
            if stream.last_token_at is None:
                stream.first_token_at = now
            else:
                self.metrics.observe_tokens(now - stream.last_token_at, len(update.new_tokens))
            stream.last_token_at = now
            stream.output_tokens += len(update.new_tokens)
            outbox.append((stream, Delta(update.new_tokens, update.seq.finish_reason)))
            if update.seq.finish_reason:
                self._account(stream, "ok")
        if outbox:
            self._send_all(outbox)
        self._publish_state()

    def _send(self, stream: RequestStream, delta: Delta) -> None:
        self._send_all([(stream, delta)])

    def _send_all(self, outbox: list[tuple[RequestStream, Delta]]) -> None:
        """One wake-up of the event loop per iteration, not one per request."""
        assert self._aio is not None
        self._aio.call_soon_threadsafe(_deliver, outbox)

    def _end(self, stream: RequestStream, outcome: str) -> None:
        if not stream.done:
            self.engine.abort(stream.seq)
            self._account(stream, outcome)

    def _fail(self, stream: RequestStream, message: str) -> None:
        if not stream.done:
            self.engine.abort(stream.seq)
            self._send(stream, Delta([], "error", message))
            self._account(stream, "error")

    def _account(self, stream: RequestStream, outcome: str) -> None:
        stream.done = True
        self._streams.pop(stream.seq.seq_id, None)
        timing = None
        if stream.first_token_at is not None:
            timing = RequestTiming(
                ttft=stream.first_token_at - stream.submitted_at,
                e2e=self.clock() - stream.submitted_at,
                output_tokens=stream.output_tokens,
            )
        met = (
            outcome == "ok"
            and timing is not None
            and timing.meets(self.slo.ttft_ms / 1e3, self.slo.tpot_ms / 1e3)
        )
        self.metrics.observe_request(timing, outcome, met, stream.seq.prompt_len)

    def _publish_state(self) -> None:
        """Every iteration, and every 50 ms while idle: so the exploration gauge (and the
        log line) follow a lease's expiry with no request and no settings change."""
        sched = self.engine.scheduler
        self.metrics.set_speculation(self.speculation.threshold, self.engine.gate.exploration())
        self.metrics.set_state(
            len(sched.running),
            len(sched.waiting),
            self.engine.kv_usage,
            self.engine.admitted_concurrency,
        )
        self.metrics.fixed_shapes.set(self.engine.fixed_shapes)
        if self.engine.simulation is not None:
            self.metrics.count_overruns(self.engine.simulation.overruns)


def _deliver(outbox: list[tuple[RequestStream, Delta]]) -> None:
    for stream, delta in outbox:
        stream.deltas.put_nowait(delta)
