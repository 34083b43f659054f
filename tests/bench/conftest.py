"""The tiny pair's in-process engine, shared by a module's tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_engine(tiny_pair):
    from spectune.engine.config import EngineConfig
    from spectune.engine.engine import LLMEngine

    target, draft = tiny_pair
    return LLMEngine(EngineConfig(model=str(target), draft=str(draft), device="cpu"))
