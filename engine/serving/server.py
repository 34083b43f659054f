"""The engine's HTTP server: OpenAI-compatible API, admin API, health, metrics.

Handlers are thin: they validate, hand the request to the engine loop and turn its
token deltas into OpenAI JSON or server-sent events. Every refusal is a 4xx with an
OpenAI-style error body.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Body, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from spectune.engine.config import EngineConfig
from spectune.engine.engine import LLMEngine
from spectune.engine.sequence import InvalidRequest, SamplingParams
from spectune.engine.serving import openai_protocol as oai
from spectune.engine.serving.engine_loop import (
    Delta,
    Draining,
    EngineLoop,
    Overloaded,
    RequestStream,
)
from spectune.engine.serving.health import Health
from spectune.engine.serving.metrics import EngineMetrics
from spectune.engine.serving.settings import (
    ServeSettings,
    SettingsError,
    SpeculationSettings,
    speculation_from_file,
)
from spectune.engine.serving.text import IncrementalText, TemplateError, render_chat
from spectune.engine.torch_thread import on_torch_thread
from spectune.engine.zoo.registry import resolve_model

log = logging.getLogger("spectune.engine")
VERSION = "0.1.0"
CONFIG_POLL_SECONDS = 1.0
# Answer to a client that left before its answer (nginx's code; nobody reads it): the request
# already counts as `error`, so it is not counted again as `invalid`.
CLIENT_CLOSED = 499
INFERENCE = {("POST", "/v1/completions"), ("POST", "/v1/chat/completions")}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.headers = (
            status,
            message,
            kind,
            param,
            headers,
        )


class BodyLimit:
    """Refuse request bodies over `limit` bytes with a 413, whether or not they declare a length."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.limit:
            return await self._refuse(send)
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise ApiError(413, f"request body over {self.limit} bytes")
            return message

        try:
            await self.app(scope, limited, send)
        except ApiError:
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            oai.error_body(f"request body over {self.limit} bytes", "invalid_request_error")
        ).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class CountInvalid:
    """Count inference requests refused for what they hold (a 4xx other than 429: bad
    parameters, bad JSON, an unknown model, a body over the limit) as outcome `invalid`,
    whichever layer refused them, so that goodput's denominator sees them too."""

    def __init__(self, app: ASGIApp, server: Server) -> None:
        self.app, self.server = app, server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"], scope["path"]) not in INFERENCE:
            return await self.app(scope, receive, send)

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                status, loop = message["status"], self.server.loop
                if 400 <= status < 500 and status not in (429, CLIENT_CLOSED) and loop is not None:
                    loop.metrics.observe_request(None, "invalid", False)
            await send(message)

        await self.app(scope, receive, watch)


class TokenFirst(APIRoute):
    """An admin route: the bearer token is checked before FastAPI reads or validates the
    body, so an unauthenticated caller learns nothing about what it sent."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            request.app.state.server.check_token(request)
            return await handle(request)

        return guarded


def _process_age() -> float:
    """Seconds since this process started (Linux's /proc; 0 elsewhere), so that the startup
    time counts Python's imports too (torch's take seconds)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


class Server:
    """Owns the engine loop for the app's lifetime; routes call into it."""

    def __init__(self, settings: ServeSettings, on_failure: Callable[[], None]) -> None:
        self.settings = settings
        self.on_failure = on_failure
        self.loop: EngineLoop | None = None
        self.ready = False
        self.failure: Exception | None = None
        self.started = int(time.time())
        self.began = time.monotonic() - _process_age()

    # --- lifecycle ---------------------------------------------------------------------

    def engine_config(self) -> EngineConfig:
        s = self.settings
        return EngineConfig(
            model=s.model,
            draft=s.draft,
            method=s.method,
            k=s.speculation.k,
            gate=s.speculation.gate(),
            max_batch_size=s.max_batch_size,
            max_model_len=s.max_model_len,
            kv_cache_bytes=s.kv_cache_bytes,
            device=s.device,
            dtype=s.dtype,
            attention=s.attention,
            compile=s.compile,
            seed=s.seed,
            simulate_device=s.simulate_device,
            simulate_time_scale=s.simulate_time_scale,
            simulate_extra_context=s.simulate_extra_context,
            simulate_context_scale=s.simulate_context_scale,
        )

    async def start_or_fail(self) -> None:
        """Load the engine in the background (probes answer meanwhile). A server whose engine
        cannot start says why and stops, so that its pod restarts with the reason in its
        status, instead of answering 503 on /readyz forever."""
        try:
            await self.startup()
        except Exception as err:
            self.failure = err
            log.error("the engine did not start: %s", err)
            self.on_failure()

    async def startup(self) -> None:
        config = self.engine_config()
        engine = await on_torch_thread(lambda: LLMEngine(config, resolve_model=resolve_model))
        warmed = time.monotonic()
        built = await on_torch_thread(engine.warm_up)  # Ready means warm
        log.info("warmed up in %.1f s: %d fixed shapes", time.monotonic() - warmed, built)
        device = engine.device_label
        metrics = EngineMetrics(
            {
                "device": device,
                "simulated": "true" if engine.simulation else "false",
                "model": self.settings.model_id,
                "draft": self.settings.draft or "",
                "version": VERSION,
            }
        )
        self.loop = EngineLoop(
            engine,
            metrics,
            self.settings.speculation,
            self.settings.slo,
            self.settings.max_queue,
            clock=engine.simulation.clock if engine.simulation else time.monotonic,
            health=Health(hang_seconds=self.settings.hang_timeout_s),
        )
        self.loop.start(asyncio.get_running_loop())
        startup = time.monotonic() - self.began
        metrics.startup_seconds.set(startup)
        self.ready = True
        log.info(
            "ready in %.1f s: model=%s draft=%s method=%s device=%s admitted_concurrency=%d",
            startup,
            self.settings.model,
            self.settings.draft,
            engine.config.method,
            device,
            engine.admitted_concurrency,
        )

    async def shutdown(self) -> None:
        self.ready = False
        if self.loop is not None:
            await self.loop.drain(self.settings.drain_timeout_s)
            self.loop.stop()

    async def watch_config(self) -> None:
        """Poll the config file; apply a changed, valid speculation section atomically."""
        path = self.settings.config_file
        if path is None:
            return
        digest = _digest(path)
        while True:
            await asyncio.sleep(CONFIG_POLL_SECONDS)
            current = _digest(path)
            if current == digest or self.loop is None:
                continue
            digest = current
            try:
                settings = speculation_from_file(path)
            except SettingsError as err:
                log.warning("config file change rejected, keeping current settings: %s", err)
                continue
            if "lease" not in settings.model_fields_set:  # a lease comes by the admin API only
                settings = settings.model_copy(update={"lease": self.loop.speculation.lease})
            await self.loop.set_speculation(settings)
            log.info("speculation settings from %s applied: %s", path, settings.model_dump())

    # --- helpers -----------------------------------------------------------------------

    def unhealthy(self) -> str | None:
        """Why the engine cannot serve (its iterations keep failing, or one is stuck)."""
        return None if self.loop is None else self.loop.health.verdict()

    def engine_loop(self) -> EngineLoop:
        if self.loop is None or not self.ready:
            raise ApiError(
                503,
                "the model is still loading",
                "service_unavailable",
                headers={"Retry-After": "5"},
            )
        return self.loop

    def check_model(self, name: str) -> None:
        s = self.settings
        if name not in (s.model_id, s.model, str(self.engine_loop().engine.target.path)):
            raise ApiError(
                404,
                f"model {name!r} does not exist; this server serves {s.model_id!r}",
                "invalid_request_error",
                "model",
            )

    def check_token(self, request: Request) -> None:
        path = self.settings.admin_token_file
        expected = path.read_text().strip() if path and path.is_file() else ""
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not expected:
            raise ApiError(
                401,
                "the admin API is disabled: no admin token is configured",
                "authentication_error",
            )
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise ApiError(401, "missing or wrong bearer token", "authentication_error")

    async def start_request(
        self, prompt: str | list[int], body: oai.SamplingFields, max_tokens: int | None
    ) -> tuple[RequestStream, IncrementalText]:
        loop = self.engine_loop()
        self.check_model(body.model)
        unsupported = body.unsupported()
        if unsupported:
            raise ApiError(
                400,
                f"parameter {unsupported!r} is not supported with that value",
                param=unsupported,
            )
        stops = body.stop_strings()
        if len(stops) > oai.MAX_STOP:
            raise ApiError(400, f"at most {oai.MAX_STOP} stop strings", param="stop")
        engine = loop.engine
        ids = engine.tokenizer.encode(prompt).ids if isinstance(prompt, str) else prompt
        room = engine.max_model_len - len(ids)
        if max_tokens is None:
            max_tokens = max(1, min(room, 16 if isinstance(body, oai.CompletionRequest) else room))
        if room >= 1 and max_tokens > room:
            raise ApiError(
                400,
                f"max_tokens {max_tokens} + prompt {len(ids)} tokens exceed the context "
                f"length {engine.max_model_len}",
                param="max_tokens",
            )
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=body.temperature,
            seed=body.seed,
            ignore_eos=body.ignore_eos,
        )
        try:
            stream = await loop.submit(ids, params)
        except InvalidRequest as err:
            raise ApiError(400, str(err), param="prompt") from err
        except Overloaded as err:
            raise ApiError(429, str(err), "rate_limit_error", headers={"Retry-After": "1"}) from err
        except Draining as err:
            raise ApiError(
                503, str(err), "service_unavailable", headers={"Retry-After": "5"}
            ) from err
        return stream, IncrementalText(engine.tokenizer, stops)

    async def start_requests(
        self, prompts: list[str | list[int]], body: oai.SamplingFields, max_tokens: int | None
    ) -> list[tuple[RequestStream, IncrementalText]]:
        """Start one request per prompt. When one is refused the whole list is: those
        already queued are withdrawn and count with the same outcome as the refusal."""
        started: list[tuple[RequestStream, IncrementalText]] = []
        try:
            for prompt in prompts:
                started.append(await self.start_request(prompt, body, max_tokens))
        except ApiError as err:
            outcome = "rejected" if err.status in (429, 503) else "invalid"
            await self.withdraw([stream for stream, _ in started], outcome)
            raise
        return started

    async def withdraw(self, streams: list[RequestStream], outcome: str) -> None:
        """End requests whose answers nobody will read. Shielded: this runs while the handler
        may be being cancelled (its client went away), and an await cancelled there would
        take the engine command with it, leaving the request running and uncounted."""
        if streams and self.loop is not None:
            loop = self.loop
            await asyncio.shield(asyncio.gather(*(loop.cancel(s, outcome) for s in streams)))

    async def deltas(
        self, stream: RequestStream, text: IncrementalText
    ) -> AsyncIterator[tuple[str, str | None]]:
        """(new text, finish reason) as the engine produces them; ends the request on a stop
        string, and cancels it if the consumer goes away."""
        finished, outcome = False, "error"
        try:
            while True:
                delta: Delta = await stream.deltas.get()
                if delta.error:
                    raise ApiError(500, delta.error, "server_error")
                piece = text.push(delta.tokens, final=delta.finish_reason is not None)
                if text.stopped:
                    finished = True
                    await self.engine_loop().cancel(stream, "ok")
                    yield piece, "stop"
                    return
                if delta.finish_reason:
                    finished = True
                    yield piece, delta.finish_reason
                    return
                if piece:
                    yield piece, None
        except (GeneratorExit, asyncio.CancelledError):
            outcome = "cancelled"  # the consumer went away: the client closed the request
            raise
        finally:
            if not finished:
                with contextlib.suppress(Exception):
                    await self.withdraw([stream], outcome)


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _describe(error: dict[str, Any]) -> tuple[str, str | None]:
    """A validation error as one line, and the parameter it names as a client writes it
    (`messages[0].content`)."""
    loc = [p for p in error["loc"] if p != "body"]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    if error["type"] == "json_invalid":
        return f"body is not valid JSON: {error.get('ctx', {}).get('error', error['msg'])}", None
    return f"{where or 'body'}: {error['msg']}", where or None


def _usage(started: list[tuple[RequestStream, IncrementalText]]) -> dict[str, int]:
    """Usage of one API request, summed over its prompts."""
    return oai.usage(
        sum(stream.seq.prompt_len for stream, _ in started),
        sum(stream.output_tokens for stream, _ in started),
    )


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def create_app(settings: ServeSettings, on_failure: Callable[[], None] = lambda: None) -> FastAPI:
    """The app; `on_failure` is called when the engine cannot start (`serve` stops uvicorn)."""
    server = Server(settings, on_failure)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        loading = asyncio.create_task(server.start_or_fail())
        watcher = asyncio.create_task(server.watch_config())
        try:
            yield
        finally:
            watcher.cancel()
            if not loading.done():
                loading.cancel()
            await server.shutdown()

    app = FastAPI(title="spectune engine", version=VERSION, lifespan=lifespan)
    app.state.server = server

    @app.exception_handler(ApiError)
    async def api_error(_r: Request, err: ApiError) -> JSONResponse:
        return JSONResponse(
            oai.error_body(err.message, err.kind, err.param), err.status, headers=err.headers
        )

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        message, where = _describe(err.errors()[0])
        # The OpenAI API answers 400 as OpenAI does; the admin API 422, as it always has.
        status = 422 if request.url.path.startswith("/admin/") else 400
        return JSONResponse(oai.error_body(message, "invalid_request_error", where), status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_r: Request, err: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            oai.error_body(str(err.detail), "invalid_request_error"), err.status_code
        )

    @app.get("/healthz", responses={503: {"description": "iterations failing, or one stuck"}})
    async def healthz() -> JSONResponse:
        if (why := server.unhealthy()) is not None:
            return JSONResponse({"status": "unhealthy", "reason": why}, 503)
        return JSONResponse({"status": "ok"})

    @app.get("/readyz", responses={503: {"description": "loading, draining or unhealthy"}})
    async def readyz() -> JSONResponse:
        ok = server.ready and server.loop is not None and server.loop.accepting
        if ok and (why := server.unhealthy()) is not None:
            return JSONResponse({"status": "not ready", "reason": why}, 503)
        return JSONResponse({"status": "ready" if ok else "not ready"}, 200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        loop = server.engine_loop()
        return Response(generate_latest(loop.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": settings.model_id,
            "object": "model",
            "created": server.started,
            "owned_by": "spectune",
        }
        if server.loop is not None and server.ready:  # the context length, as vLLM reports it
            card["max_model_len"] = server.loop.engine.max_model_len
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions", responses={400: {}, 404: {}, 413: {}, 429: {}, 503: {}})
    async def completions(body: oai.CompletionRequest, request: Request) -> Any:
        prompts = body.prompts()
        if body.stream and len(prompts) > 1:
            raise ApiError(
                400,
                "streaming takes one prompt; send a list of prompts without stream",
                param="prompt",
            )
        started = await server.start_requests(prompts, body, body.max_tokens)
        rid = oai.request_id("cmpl")
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        if body.stream:
            stream, text = started[0]

            async def events() -> AsyncIterator[str]:
                async for piece, finish in server.deltas(stream, text):
                    choice = oai.completion_choice(0, piece, finish)
                    yield _sse(oai.completion_body(rid, body.model, [choice], None))
                if include_usage:
                    yield _sse(oai.completion_body(rid, body.model, [], _usage(started)))
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        answers = await _collect_all(server, started, request)
        choices = [oai.completion_choice(i, *answer) for i, answer in enumerate(answers)]
        return oai.completion_body(rid, body.model, choices, _usage(started))

    @app.post("/v1/chat/completions", responses={400: {}, 404: {}, 413: {}, 429: {}, 503: {}})
    async def chat(body: oai.ChatCompletionRequest, request: Request) -> Any:
        engine = server.engine_loop().engine
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            prompt = render_chat(engine.target.chat_template, messages, engine.target.eos_token)
        except TemplateError as err:
            raise ApiError(400, str(err), param="messages") from err
        started = await server.start_requests(
            [prompt], body, body.max_completion_tokens or body.max_tokens
        )
        stream, text = started[0]
        rid = oai.request_id("chatcmpl")
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        if body.stream:

            async def events() -> AsyncIterator[str]:
                yield _sse(
                    oai.chat_chunk(rid, body.model, {"role": "assistant", "content": ""}, None)
                )
                async for piece, finish in server.deltas(stream, text):
                    yield _sse(
                        oai.chat_chunk(rid, body.model, {"content": piece} if piece else {}, finish)
                    )
                if include_usage:
                    yield _sse(oai.chat_chunk(rid, body.model, {}, None, _usage(started)))
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        [(pieces, finish)] = await _collect_all(server, started, request)
        return oai.chat_body(rid, body.model, pieces, finish, _usage(started))

    @app.get("/admin/speculation")
    async def get_speculation() -> dict[str, Any]:
        return _speculation_state(server.engine_loop())

    admin = APIRouter(route_class=TokenFirst)

    @admin.put("/admin/speculation", responses={401: {}, 422: {}})
    async def put_speculation(
        request: Request,
        changes: Annotated[
            SpeculationSettings,
            Body(
                description="only the fields present change; threshold null: always speculate;"
                " lease null: withdraw it, a lease given replaces the whole lease"
            ),
        ],
    ) -> dict[str, Any]:
        loop = server.engine_loop()
        given = changes.model_dump(include=changes.model_fields_set)  # absent != null
        new = SpeculationSettings.model_validate(loop.speculation.model_dump() | given)
        await loop.set_speculation(new)
        log.info(
            "speculation settings changed through the admin API by %s: %s",
            request.headers.get("user-agent", "an unnamed client")[:120],
            new.model_dump(),
        )
        return _speculation_state(loop)

    app.include_router(admin)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(CountInvalid, server=server)
    return app


async def _collect(
    server: Server, stream: RequestStream, text: IncrementalText
) -> tuple[str, str | None]:
    pieces, finish = [], None
    async for piece, finish in server.deltas(stream, text):  # noqa: B007 - the last finish is the answer
        pieces.append(piece)
    return "".join(pieces), finish


async def _collect_all(
    server: Server, started: list[tuple[RequestStream, IncrementalText]], request: Request
) -> list[tuple[str, str | None]]:
    """Each prompt's (text, finish reason). The engine runs them together, so collecting them
    in turn costs nothing; when one fails, or the client goes away before the answer (nothing
    else tells a non-streaming handler), the rest are withdrawn rather than left running."""

    async def collect() -> list[tuple[str, str | None]]:
        return [await _collect(server, stream, text) for stream, text in started]

    async def disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    work, gone = asyncio.ensure_future(collect()), asyncio.ensure_future(disconnect())
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            raise ApiError(CLIENT_CLOSED, "the client closed the request")
        return work.result()
    except BaseException:
        outcome = "error" if work.done() else "cancelled"  # not done: the client went away
        work.cancel()
        await server.withdraw([stream for stream, _ in started], outcome)
        raise
    finally:
        gone.cancel()


def _speculation_state(loop: EngineLoop) -> dict[str, Any]:
    engine = loop.engine
    return loop.speculation.model_dump() | {
        "device": engine.device_label,
        "effective_exploration": engine.gate.settings.exploration_at(time.time()),
        "method": engine.config.method,
        "running": len(engine.scheduler.running),
        "waiting": len(engine.scheduler.waiting),
        "smoothed_batch": round(engine.gate.smoothed_batch, 3),
        "admitted_concurrency": engine.admitted_concurrency,
    }
