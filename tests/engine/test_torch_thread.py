"""All torch work of a process runs on one thread: the engine is built where it steps."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from spectune.engine.bench.targets import EngineTarget
from spectune.engine.config import EngineConfig
from spectune.engine.engine import LLMEngine
from spectune.engine.torch_thread import TorchThread, on_torch_thread


def test_calls_run_in_order_on_one_thread_and_errors_reach_the_caller() -> None:
    worker = TorchThread()
    seen: list[tuple[int, int]] = []
    futures = [worker.submit(lambda i=i: seen.append((i, threading.get_ident()))) for i in range(5)]
    for f in futures:
        f.result(timeout=5)
    assert [i for i, _ in seen] == list(range(5))
    assert len({ident for _, ident in seen}) == 1
    assert seen[0][1] != threading.get_ident()
    with pytest.raises(ZeroDivisionError):
        worker.submit(lambda: 1 / 0).result(timeout=5)
    assert worker.submit(lambda: "still working").result(timeout=5) == "still working"


def test_the_engine_loop_steps_on_the_thread_that_built_the_engine(
    tiny_pair: tuple[Path, Path],
) -> None:
    async def main() -> tuple[int, int]:
        built_on: list[int] = []

        def build() -> LLMEngine:
            built_on.append(threading.get_ident())
            return LLMEngine(EngineConfig(model=str(tiny_pair[0]), device="cpu"))

        engine = await on_torch_thread(build)
        async with EngineTarget(engine) as target:
            steps_on = await target.loop.call(threading.get_ident)
        return built_on[0], steps_on

    built, steps = asyncio.run(main())
    assert built == steps != threading.get_ident()
