"""Whether the engine can serve, for the probes: a pod whose iterations keep failing, or whose
loop is stuck in one, goes unready and fails liveness (kubelet restarts it), instead of staying
Ready and taking traffic it cannot serve. A failed iteration used to be caught, its requests
failed, and the loop went on: /healthz said ok and /readyz looked only at admission, so a pod
with a sticky CUDA error answered every request with an error for ever.

The loop's thread reports each iteration's start, end or failure; the probes, on the asyncio
side, ask `verdict`. Pure bookkeeping with an injectable clock; the one action, exiting on an
error that poisons the CUDA context, is the loop's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

# Iterations failing in a row before the engine counts as broken: one is a bad request or a
# passing fault; every one of three is the engine.
FAILURE_LIMIT = 3
# What torch says when the CUDA context itself is broken: every later kernel fails too, so the
# process can only exit (kubelet restarts the container on a fresh context). Running out of
# memory is not among them: it fails one iteration's requests, and the next may fit.
POISONED = (
    "CUDA error",
    "CUBLAS_STATUS",
    "CUDNN_STATUS",
    "cuDNN error",
    "device-side assert",
    "illegal memory access",
    "unspecified launch failure",
)


def poisons_the_device(error: BaseException) -> bool:
    """Whether an iteration's error leaves the CUDA context unusable."""
    text = f"{type(error).__name__}: {error}"
    return "out of memory" not in text and any(mark in text for mark in POISONED)


@dataclass
class Health:
    """The loop's recent record. `hang_seconds`: how long one iteration may run before the
    engine counts as stuck; it must outlast the longest legitimate one (a long prefill, the
    first shapes compiled on a GPU)."""

    hang_seconds: float = 120.0
    failure_limit: int = FAILURE_LIMIT
    clock: Callable[[], float] = time.monotonic
    failures: int = 0  # in a row
    last_error: str = ""
    running_since: float | None = None  # the iteration in progress, if any

    def started(self) -> None:
        self.running_since = self.clock()

    def finished(self) -> None:
        self.running_since = None
        self.failures = 0

    def failed(self, error: BaseException) -> None:
        self.running_since = None
        self.failures += 1
        self.last_error = f"{type(error).__name__}: {error}"[:300]

    def verdict(self) -> str | None:
        """Why the engine cannot serve now, or None when it can."""
        if self.failures >= self.failure_limit:
            return f"{self.failures} iterations failed in a row, the last with {self.last_error}"
        since = self.running_since
        if since is not None and (stuck := self.clock() - since) > self.hang_seconds:
            return (
                f"an iteration has run for {stuck:.0f} s, longer than the {self.hang_seconds:g} s "
                "any may take: the engine is stuck"
            )
        return None
