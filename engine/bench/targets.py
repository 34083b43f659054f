"""What the load generator drives: an OpenAI-compatible server over HTTP, or the
in-process engine behind the same `EngineLoop` the server uses (everything but HTTP).

Both stream completions, switch the speculation threshold between load levels (the
admin API, or the loop's settings command) and report engine-side counters: per
(mode, bucket) decode steps, drafted and accepted tokens. Against a URL those come
from /metrics; a server without spectune's metric contract gives none.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from spectune.engine import contract as c
from spectune.engine.bench.loadgen import NO_COUNTERS, Counters, Finished, Output, RequestFailed
from spectune.engine.bench.schema import Target
from spectune.engine.bench.workload import BenchError, RequestSpec
from spectune.engine.crossover import ModeStats, aggregate
from spectune.engine.engine import Iteration, LLMEngine
from spectune.engine.sequence import InvalidRequest, SamplingParams
from spectune.engine.serving.engine_loop import Draining, EngineLoop, Overloaded
from spectune.engine.serving.metrics import EngineMetrics
from spectune.engine.serving.settings import SloSettings, SpeculationSettings


def counters_of(iterations: list[Iteration]) -> Counters:
    decode = [it for it in iterations if it.mode != "prefill"]
    return Counters(
        aggregate(decode),
        sum(it.drafted for it in decode),
        sum(it.accepted for it in decode),
        len(decode),
        float(sum(it.batch_size for it in decode)),
    )


class EngineTarget:
    """The in-process engine; use as `async with`."""

    def __init__(self, engine: LLMEngine, max_queue: int = 100_000) -> None:
        self.engine = engine
        self.max_queue = max_queue
        self._loop: EngineLoop | None = None
        self._totals = NO_COUNTERS
        self._cleanups: set[asyncio.Future] = set()  # cancels in flight, kept from the GC

    async def __aenter__(self) -> EngineTarget:
        engine = self.engine
        speculation = SpeculationSettings(k=engine.k, threshold=engine.gate.settings.threshold)
        info = {
            "device": str(engine.device),
            "model": engine.config.model,
            "draft": "",
            "version": "",
        }
        self._loop = EngineLoop(
            engine, EngineMetrics(info), speculation, SloSettings(), self.max_queue
        )
        self._loop.start(asyncio.get_running_loop())
        await self._loop.call(engine.iterations.clear)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self._loop is not None
        await asyncio.gather(*self._cleanups, return_exceptions=True)
        self._loop.stop()

    @property
    def loop(self) -> EngineLoop:
        assert self._loop is not None, "use EngineTarget as an async context manager"
        return self._loop

    async def stream(self, spec: RequestSpec) -> AsyncIterator[Output | Finished]:
        ids = self.engine.tokenizer.encode(spec.prompt).ids
        params = SamplingParams(
            max_tokens=spec.max_tokens, temperature=spec.temperature, ignore_eos=True
        )
        submit = asyncio.ensure_future(self.loop.submit(ids, params))
        try:
            stream = await asyncio.shield(submit)
        except (InvalidRequest, Overloaded, Draining) as err:
            raise RequestFailed(str(err)) from None
        except asyncio.CancelledError:  # timed out while queueing: cancel it once it exists
            cleanup = asyncio.ensure_future(self._cancel_once_submitted(submit))
            self._cleanups.add(cleanup)
            cleanup.add_done_callback(self._cleanups.discard)
            raise
        tokens, finished = 0, False
        try:
            while not finished:
                delta = await stream.deltas.get()
                if delta.error:
                    raise RequestFailed(delta.error)
                tokens += len(delta.tokens)
                finished = delta.finish_reason is not None
                if delta.tokens:
                    yield Output()
            yield Finished(tokens)
        finally:
            if not finished:  # timed out or abandoned: free its KV now
                with contextlib.suppress(Exception):
                    await self.loop.cancel(stream, "error")

    async def _cancel_once_submitted(self, submit: asyncio.Future) -> None:
        """Registered at once, so that leaving the context waits for a submit still queued."""
        try:
            stream = await submit
        except (InvalidRequest, Overloaded, Draining):
            return
        await self.loop.cancel(stream, "error")

    async def set_threshold(self, threshold: int | None) -> None:
        settings = self.loop.speculation.model_copy(update={"threshold": threshold})
        await self.loop.set_speculation(settings)

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    async def threshold(self) -> int | None:
        return self.loop.speculation.threshold

    async def counters(self) -> Counters:
        iterations = await self.loop.call(self._take_iterations)
        self._totals = self._totals + counters_of(iterations)
        return self._totals

    def _take_iterations(self) -> list[Iteration]:
        """On the loop thread: hand over the records so far, so the deque never overflows."""
        taken = list(self.engine.iterations)
        self.engine.iterations.clear()
        return taken


class HttpTarget:
    """An OpenAI-compatible server; use as `async with`. With an admin token, the
    threshold it had before the bench is put back at the end."""

    def __init__(
        self, url: str, model: str | None, admin_token: str | None, timeout_s: float
    ) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.admin_token = admin_token
        self._http = httpx.AsyncClient(
            base_url=self.url,
            timeout=httpx.Timeout(timeout_s, connect=10),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )
        self._restore: dict[str, Any] | None = None
        self.max_model_len: int | None = None  # when /v1/models says (vLLM does)

    async def __aenter__(self) -> HttpTarget:
        models = await self._get_json("/v1/models")
        if self.model is None:
            try:
                self.model = models["data"][0]["id"]
            except (KeyError, IndexError, TypeError):
                raise BenchError(
                    f"{self.url}/v1/models lists no model; pass --served-model"
                ) from None
        cards = models.get("data") if isinstance(models, dict) else None
        for card in cards if isinstance(cards, list) else []:
            if isinstance(card, dict) and card.get("id") == self.model:
                limit = card.get("max_model_len")
                self.max_model_len = limit if isinstance(limit, int) and limit > 0 else None
        return self

    async def describe(self) -> Target:
        """What the server says it runs; a server without spectune's admin API says less."""
        try:
            state = await self._get_json("/admin/speculation")
        except BenchError:
            state = {}
        method = state.get("method", "unknown") if isinstance(state, dict) else "unknown"
        k = state.get("k") if isinstance(state, dict) else None
        return Target(model=self.model or "", draft=None, method=method, k=k, url=self.url)

    async def __aexit__(self, *_exc: object) -> None:
        try:
            if self._restore is not None:
                changed = ("threshold", "exploration", "lease")
                await self._put_speculation({k: self._restore[k] for k in changed})
        finally:
            await self._http.aclose()

    async def _get_json(self, path: str) -> Any:
        try:
            response = await self._http.get(path)
        except httpx.HTTPError as err:
            raise BenchError(f"cannot reach {self.url}: {_reason(err)}") from None
        if response.status_code != 200:
            raise BenchError(f"{self.url}{path}: HTTP {response.status_code}: {_message(response)}")
        try:
            return response.json()
        except ValueError:
            raise BenchError(f"{self.url}{path} did not answer JSON") from None

    async def stream(self, spec: RequestSpec) -> AsyncIterator[Output | Finished]:
        body = {
            "model": self.model,
            "prompt": spec.prompt,
            "max_tokens": spec.max_tokens,
            "temperature": spec.temperature,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        try:
            async with self._http.stream("POST", "/v1/completions", json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise RequestFailed(f"HTTP {response.status_code}: {_message(response)}")
                async for line in response.aiter_lines():
                    for event in _events(line):
                        yield event
        except httpx.HTTPError as err:
            raise RequestFailed(f"cannot reach {self.url}: {_reason(err)}") from None

    async def set_threshold(self, threshold: int | None) -> None:
        await self._change({"threshold": threshold})

    async def set_exploration(self, share: float, lease_seconds: float | None = None) -> None:
        """The share of iterations the engine runs in the other mode: its base (plain where the
        threshold speculates) or, for `lease_seconds`, a lease as a calibration raises it
        (both modes); put back on exit, like the threshold."""
        if lease_seconds is None:
            await self._change({"exploration": share, "lease": None})
        else:
            until = time.time() + lease_seconds
            await self._change({"lease": {"exploration": share, "until": until}})

    async def _change(self, body: dict[str, Any]) -> None:
        if self._restore is None:
            self._restore = await self._get_json("/admin/speculation")
        await self._put_speculation(body)

    async def threshold(self) -> int | None:
        state = await self._get_json("/admin/speculation")
        threshold = state.get("threshold", "") if isinstance(state, dict) else ""
        if threshold is not None and not isinstance(threshold, int):
            raise BenchError(f"{self.url}/admin/speculation reports no threshold")
        return threshold

    async def _put_speculation(self, body: dict[str, Any]) -> None:
        if not self.admin_token:
            raise BenchError("switching policies on a URL needs --admin-token-file")
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        try:
            response = await self._http.put("/admin/speculation", json=body, headers=headers)
        except httpx.HTTPError as err:
            raise BenchError(f"cannot reach {self.url}: {_reason(err)}") from None
        if response.status_code != 200:
            raise BenchError(
                f"cannot change the speculation settings: HTTP {response.status_code}: "
                f"{_message(response)}"
            )

    async def counters(self) -> Counters | None:
        """Engine-side counters from /metrics; None when the server has no spectune metrics."""
        try:
            response = await self._http.get("/metrics")
        except httpx.HTTPError:
            return None
        return parse_counters(response.text) if response.status_code == 200 else None


def _events(line: str) -> list[Output | Finished]:
    """The events in one server-sent-events line of an OpenAI completion stream."""
    if not line.startswith("data:"):
        return []
    data = line.removeprefix("data:").strip()
    if data == "[DONE]":
        return []
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError:
        raise RequestFailed("the server streamed something that is not JSON") from None
    if chunk.get("error"):
        raise RequestFailed(f"the server reported: {chunk['error'].get('message', chunk['error'])}")
    events: list[Output | Finished] = []
    if any(choice.get("text") for choice in chunk.get("choices") or []):
        events.append(Output())
    if chunk.get("usage"):
        events.append(Finished(int(chunk["usage"]["completion_tokens"])))
    return events


def parse_counters(text: str) -> Counters | None:
    """Per (mode, bucket) decode steps and the speculation counters from a /metrics page."""
    seconds: dict[tuple[str, int], float] = {}
    counts: dict[tuple[str, int], float] = {}
    tokens: dict[tuple[str, int], float] = {}
    drafted = accepted = overruns = 0.0
    spectune = False
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.labels.get("mode", ""), int(s.labels.get("batch", "0") or 0))
            if s.name == c.STEP_SECONDS + "_sum":
                seconds[key] = s.value
            elif s.name == c.STEP_SECONDS + "_count":
                counts[key] = s.value
            elif s.name == c.STEP_OUTPUT_TOKENS:
                tokens[key] = s.value
            elif s.name == c.SPEC_DRAFT_TOKENS:
                drafted = s.value
            elif s.name == c.SPEC_ACCEPTED_TOKENS:
                accepted = s.value
            elif s.name == c.SIMULATED_OVERRUNS:
                overruns = s.value
            spectune = spectune or s.name == c.ENGINE_INFO
    if not spectune:
        return None
    steps = {
        k: ModeStats(int(n), int(tokens.get(k, 0)), seconds.get(k, 0.0)) for k, n in counts.items()
    }
    return Counters(
        steps,
        int(drafted),
        int(accepted),
        sum(s.steps for s in steps.values()),
        float(sum(s.steps * bucket for (_, bucket), s in steps.items())),
        int(overruns),
    )


def _message(response: httpx.Response) -> str:
    """The error message of an OpenAI-style (or any) error body, on one line."""
    try:
        body = response.json()
        text = body["error"]["message"] if isinstance(body.get("error"), dict) else str(body)
    except (ValueError, KeyError, TypeError, AttributeError):
        text = response.text
    return " ".join(text.split())[:300] or response.reason_phrase


def _reason(err: httpx.HTTPError) -> str:
    return str(err) or type(err).__name__
