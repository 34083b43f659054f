"""Health that tells the truth (issue 60): a server whose iterations keep failing, or whose loop
is stuck in one, answers 503 on /healthz (its kubelet restarts it) and goes unready, and an
error that breaks the CUDA context exits the process. Before, a failed iteration was caught and
the loop went on, /healthz always answered 200 and /readyz looked at admission only.

The real app in this process (its lifespan loads the tiny target on the torch thread), with
the fault put where a device would put it: the engine's step."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from spectune.engine import contract
from spectune.engine.serving.health import Health, poisons_the_device
from spectune.engine.serving.server import create_app
from spectune.engine.serving.settings import ServeSettings

from .metrics_text import parse, total

BODY = {"model": "tiny-target", "prompt": "def main():\n", "max_tokens": 8, "temperature": 0}


def test_failures_in_a_row_and_a_stuck_iteration_are_unhealthy() -> None:
    now = [0.0]
    health = Health(hang_seconds=30, clock=lambda: now[0])
    for _ in range(2):
        health.started()
        health.failed(RuntimeError("boom"))
    assert health.verdict() is None  # two in a row: a passing fault
    health.started()
    health.finished()
    health.failed(RuntimeError("boom"))
    assert health.verdict() is None  # a success in between resets the count
    health.failed(RuntimeError("boom"))
    health.failed(RuntimeError("boom"))
    assert health.verdict() == "3 iterations failed in a row, the last with RuntimeError: boom"
    health.started()
    health.finished()
    health.started()
    now[0] = 30.0
    assert health.verdict() is None
    now[0] = 31.0
    assert health.verdict() == (
        "an iteration has run for 31 s, longer than the 30 s any may take: the engine is stuck"
    )


def test_only_errors_that_break_the_cuda_context_poison_it() -> None:
    assert poisons_the_device(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert poisons_the_device(RuntimeError("CUDA error: device-side assert triggered"))
    assert poisons_the_device(RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED when calling cublas"))
    assert not poisons_the_device(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert not poisons_the_device(ValueError("a bad request"))


async def ask(client: httpx.AsyncClient, path: str) -> tuple[int, dict]:
    answer = await client.get(path)
    return answer.status_code, answer.json()


async def served(
    tmp_path, fault: Callable[[Callable[[], object]], Callable[[], object]], hang_s: float = 60.0
) -> AsyncIterator[tuple[httpx.AsyncClient, object]]:
    settings = ServeSettings(
        model="tiny-target", method="none", max_model_len=256, hang_timeout_s=hang_s
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        server = app.state.server
        for _ in range(600):
            if server.ready or server.failure:
                break
            await asyncio.sleep(0.1)
        assert server.ready, server.failure
        engine = server.loop.engine
        engine.step = fault(engine.step)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://engine") as client:
            yield client, server


def test_iterations_that_keep_failing_fail_liveness_and_readiness(tiny_pair, tmp_path) -> None:
    def failing(step: Callable[[], object]) -> Callable[[], object]:
        def raises() -> object:
            raise RuntimeError("the device went away")

        return raises

    async def run() -> None:
        async for client, _server in served(tmp_path, failing):
            assert await ask(client, "/healthz") == (200, {"status": "ok"})
            for n in range(3):
                answer = await client.post("/v1/completions", json=BODY)
                assert answer.status_code == 500 or "error" in answer.text, answer.text
                if n < 2:
                    assert (await ask(client, "/healthz"))[0] == 200
            code, body = await ask(client, "/healthz")
            assert code == 503 and body["status"] == "unhealthy"
            assert "3 iterations failed in a row" in body["reason"]
            assert "the device went away" in body["reason"]
            code, body = await ask(client, "/readyz")
            assert code == 503 and "iterations failed" in body["reason"]
            metrics = parse((await client.get("/metrics")).text)
            assert total(metrics, contract.ITERATION_FAILURES) == 3

    asyncio.run(run())


def test_an_iteration_that_hangs_fails_liveness_once_past_the_timeout(tiny_pair, tmp_path) -> None:
    release = threading.Event()

    def hanging(step: Callable[[], object]) -> Callable[[], object]:
        def blocks() -> object:
            release.wait(30)
            return step()

        return blocks

    async def run() -> None:
        async for client, _server in served(tmp_path, hanging, hang_s=1.0):
            request = asyncio.create_task(client.post("/v1/completions", json=BODY))
            await asyncio.sleep(0.3)
            assert (await ask(client, "/healthz"))[0] == 200  # within the timeout
            await asyncio.sleep(1.2)
            code, body = await ask(client, "/healthz")
            assert code == 503 and "the engine is stuck" in body["reason"]
            assert (await ask(client, "/readyz"))[0] == 503
            release.set()
            assert (await request).status_code == 200
            assert await ask(client, "/healthz") == (200, {"status": "ok"})  # it came back

    asyncio.run(run())


def test_an_error_that_breaks_the_cuda_context_ends_the_process(tiny_pair, tmp_path) -> None:
    """Every later kernel would fail too: the loop hands the error to its exit (os._exit in a
    server; here a stand-in that records it), with the requests failed first or not at all."""
    ended: list[BaseException] = []

    def poisoned(step: Callable[[], object]) -> Callable[[], object]:
        def raises() -> object:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        return raises

    async def run() -> None:
        async for client, server in served(tmp_path, poisoned):
            server.loop.poisoned = ended.append
            await client.post("/v1/completions", json=BODY)
            assert [str(e) for e in ended] == [
                "CUDA error: an illegal memory access was encountered"
            ]

    asyncio.run(run())


@pytest.mark.parametrize("reason", ["CUDA error: misaligned address"])
def test_the_exit_says_what_broke_in_one_line(reason: str, tmp_path) -> None:
    import subprocess
    import sys

    code = (
        "from spectune.engine.serving.engine_loop import exit_poisoned;"
        f"exit_poisoned(RuntimeError({reason!r} + chr(10) + 'a second line'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert done.returncode == 3
    assert done.stderr.strip().splitlines() == [
        f"spectune-engine: error: the CUDA context is broken (RuntimeError: {reason}); "
        "exiting so that it restarts"
    ]
