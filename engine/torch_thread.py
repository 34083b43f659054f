"""The one thread that runs the process's torch work: building engines and their loops.

With OpenMP (torch's CPU intra-op threads), every OS thread that runs a parallel op gets
its own pool of workers, and libgomp stops spin-waiting between ops once it manages more
threads than there are CPUs. A server that built its engine on one thread and stepped it
on another ran every decode step ~1.5x slower on 2 cores (bench-target, batch 16:
23.4 vs 14.9 ms). Running everything torch on this one thread keeps a single pool.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class TorchThread:
    """A daemon thread that runs submitted calls one after another, in order."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future, Callable[[], Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[[], Any]) -> Future:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="torch", daemon=True)
                self._thread.start()
        future: Future = Future()
        self._jobs.put((future, fn))
        return future

    def _work(self) -> None:
        while True:
            future, fn = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as err:  # handed to the caller, who re-raises it
                future.set_exception(err)


TORCH_THREAD = TorchThread()


async def on_torch_thread(fn: Callable[[], Any]) -> Any:
    """Run fn on the torch thread (after anything queued before it) and return its result."""
    return await asyncio.wrap_future(TORCH_THREAD.submit(fn))
