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
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
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
from spectune.engine.serving.metrics import EngineMetrics
from spectune.engine.serving.settings import (
    ServeSettings,
    SettingsError,
    SpeculationSettings,
    explain,
    speculation_from_file,
)
from spectune.engine.serving.text import IncrementalText, TemplateError, render_chat
from spectune.engine.torch_thread import on_torch_thread
from spectune.engine.zoo.registry import resolve_model

log = logging.getLogger("spectune.engine")
VERSION = "0.1.0"
CONFIG_POLL_SECONDS = 1.0


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


class Server:
    """Owns the engine loop for the app's lifetime; routes call into it."""

    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        self.loop: EngineLoop | None = None
        self.ready = False
        self.started = int(time.time())

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
            seed=s.seed,
        )

    async def startup(self) -> None:
        config = self.engine_config()
        engine = await on_torch_thread(lambda: LLMEngine(config, resolve_model=resolve_model))
        warm_up = SamplingParams(max_tokens=4, ignore_eos=True)
        await on_torch_thread(lambda: engine.generate(["warm up"], warm_up))
        device = (
            torch.cuda.get_device_name(engine.device) if engine.device.type == "cuda" else "cpu"
        )
        metrics = EngineMetrics(
            {
                "device": device,
                "model": self.settings.model,
                "draft": self.settings.draft or "",
                "version": VERSION,
            }
        )
        self.loop = EngineLoop(
            engine, metrics, self.settings.speculation, self.settings.slo, self.settings.max_queue
        )
        self.loop.start(asyncio.get_running_loop())
        self.ready = True
        log.info(
            "ready: model=%s draft=%s method=%s device=%s admitted_concurrency=%d",
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
            await self.loop.set_speculation(settings)
            log.info("speculation settings from %s applied: %s", path, settings.model_dump())

    # --- helpers -----------------------------------------------------------------------

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
        if name not in (self.settings.model, str(self.engine_loop().engine.target.path)):
            raise ApiError(
                404,
                f"model {name!r} does not exist; this server serves {self.settings.model!r}",
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

    async def deltas(
        self, stream: RequestStream, text: IncrementalText
    ) -> AsyncIterator[tuple[str, str | None]]:
        """(new text, finish reason) as the engine produces them; ends the request on a stop
        string, and cancels it if the consumer goes away."""
        finished = False
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
        finally:
            if not finished and self.loop is not None:
                with contextlib.suppress(Exception):
                    await self.loop.cancel(stream, "error")


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def create_app(settings: ServeSettings) -> FastAPI:
    server = Server(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        loading = asyncio.create_task(server.startup())
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
    async def invalid(_r: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"] if p != "body")
        return JSONResponse(
            oai.error_body(
                f"{where or 'body'}: {first['msg']}", "invalid_request_error", where or None
            ),
            400,
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_r: Request, err: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            oai.error_body(str(err.detail), "invalid_request_error"), err.status_code
        )

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"description": "loading or draining"}})
    async def readyz() -> JSONResponse:
        ok = server.ready and server.loop is not None and server.loop.accepting
        return JSONResponse({"status": "ready" if ok else "not ready"}, 200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        loop = server.engine_loop()
        return Response(generate_latest(loop.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": settings.model,
            "object": "model",
            "created": server.started,
            "owned_by": "spectune",
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions", responses={400: {}, 404: {}, 413: {}, 429: {}, 503: {}})
    async def completions(body: oai.CompletionRequest) -> Any:
        stream, text = await server.start_request(body.prompt, body, body.max_tokens)
        rid = oai.request_id("cmpl")
        prompt_tokens = stream.seq.prompt_len
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        if body.stream:

            async def events() -> AsyncIterator[str]:
                async for piece, finish in server.deltas(stream, text):
                    yield _sse(oai.completion_body(rid, body.model, piece, finish, None))
                if include_usage:
                    chunk = oai.completion_body(
                        rid, body.model, "", None, oai.usage(prompt_tokens, stream.output_tokens)
                    )
                    chunk["choices"] = []
                    yield _sse(chunk)
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        pieces, finish = await _collect(server, stream, text)
        return oai.completion_body(
            rid, body.model, pieces, finish, oai.usage(prompt_tokens, stream.output_tokens)
        )

    @app.post("/v1/chat/completions", responses={400: {}, 404: {}, 413: {}, 429: {}, 503: {}})
    async def chat(body: oai.ChatCompletionRequest) -> Any:
        engine = server.engine_loop().engine
        messages = [m.model_dump() for m in body.messages]
        try:
            prompt = render_chat(engine.target.chat_template, messages)
        except TemplateError as err:
            raise ApiError(400, str(err), param="messages") from err
        stream, text = await server.start_request(
            prompt, body, body.max_completion_tokens or body.max_tokens
        )
        rid = oai.request_id("chatcmpl")
        prompt_tokens = stream.seq.prompt_len
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
                    use = oai.usage(prompt_tokens, stream.output_tokens)
                    yield _sse(oai.chat_chunk(rid, body.model, {}, None, use))
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        pieces, finish = await _collect(server, stream, text)
        return oai.chat_body(
            rid, body.model, pieces, finish, oai.usage(prompt_tokens, stream.output_tokens)
        )

    @app.get("/admin/speculation")
    async def get_speculation() -> dict[str, Any]:
        return _speculation_state(server.engine_loop())

    @app.put("/admin/speculation", responses={401: {}, 422: {}})
    async def put_speculation(request: Request) -> dict[str, Any]:
        server.check_token(request)
        loop = server.engine_loop()
        try:
            changes = json.loads(await request.body())
        except json.JSONDecodeError as err:
            raise ApiError(422, f"body is not JSON: {err}") from err
        if not isinstance(changes, dict):
            raise ApiError(
                422, "body must be a JSON object with any of: k, threshold, hysteresis, exploration"
            )
        try:
            new = SpeculationSettings.model_validate(loop.speculation.model_dump() | changes)
        except ValidationError as err:
            raise ApiError(422, explain(err)) from err
        await loop.set_speculation(new)
        log.info("speculation settings changed through the admin API: %s", new.model_dump())
        return _speculation_state(loop)

    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    return app


async def _collect(
    server: Server, stream: RequestStream, text: IncrementalText
) -> tuple[str, str | None]:
    pieces, finish = [], None
    async for piece, finish in server.deltas(stream, text):  # noqa: B007 - the last finish is the answer
        pieces.append(piece)
    return "".join(pieces), finish


def _speculation_state(loop: EngineLoop) -> dict[str, Any]:
    engine = loop.engine
    return loop.speculation.model_dump() | {
        "method": engine.config.method,
        "running": len(engine.scheduler.running),
        "waiting": len(engine.scheduler.waiting),
        "smoothed_batch": round(engine.gate.smoothed_batch, 3),
        "admitted_concurrency": engine.admitted_concurrency,
    }
