"""The tiny pair's in-process engine, shared by a module's tests; the Prometheus binary."""

from __future__ import annotations

import pytest

from tests.cluster.support import LOCAL, built


@pytest.fixture(scope="session")
def prometheus_binary() -> None:
    """Install Prometheus (hack/build-binaries.sh). Tests that run it use this fixture, and so
    must be marked `tools` (or `cluster`)."""
    built(LOCAL / "bin" / "prometheus", "prometheus")


@pytest.fixture(scope="module")
def tiny_engine(tiny_pair):
    from spectune.engine.config import EngineConfig
    from spectune.engine.engine import LLMEngine

    target, draft = tiny_pair
    return LLMEngine(EngineConfig(model=str(target), draft=str(draft), device="cpu"))
