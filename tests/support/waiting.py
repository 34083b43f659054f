"""Waiting on a condition instead of sleeping for "long enough": the one poll loop of the tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def is_programming_error(error: Exception) -> bool:
    """An error no amount of waiting fixes (a typo in the probe): a name or a module that does
    not exist, or an attribute missing on an object that is there. Everything else (a
    component still starting, a field still None) may pass, and is retried."""
    if isinstance(error, NameError | ImportError):
        return True
    return isinstance(error, AttributeError) and getattr(error, "obj", None) is not None


def wait_until(
    what: str, probe: Callable[[], T | None], timeout: float = 120, every: float = 0.5
) -> T:
    """Poll until probe() returns something truthy, and return it. After `timeout` seconds,
    fail naming `what` and what the probe last did (the exception it raised, or the value it
    returned); a programming error in the probe fails at once."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value, last = probe(), None
        except Exception as error:
            if is_programming_error(error):
                raise
            value, last = None, error
        if value:
            return value
        if time.monotonic() >= deadline:
            said = (
                f"the probe last raised {type(last).__name__}: {last}"
                if last is not None
                else f"the probe last returned {value!r}"
            )
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}: {said}")
        time.sleep(every)
