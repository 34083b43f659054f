"""A real `spectune-engine serve` process on a free loopback port, per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .support import Served, start_server, stop_server


@pytest.fixture(scope="module")
def server(tiny_pair, tmp_path_factory) -> Iterator[Served]:
    """Target + draft, speculation always on, short context so fuzzed requests stay quick."""
    config = {
        "model": "tiny-target",
        "draft": "tiny-draft",
        "max_model_len": 256,
        "speculation": {"k": 4, "threshold": None},
    }
    served = start_server(tmp_path_factory.mktemp("server"), config)
    yield served
    stop_server(served)
