"""The cluster tests run in order: the restart test (down, then a timed warm up) last."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the restart test after every other cluster test."""
    items.sort(key=lambda item: getattr(item.module, "__name__", "").endswith(".test_restart"))
