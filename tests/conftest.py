"""Shared fixtures: the project's own tiny model pair, built once and cached."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.conftest import cluster  # noqa: F401 - the local cluster, for every suite


@pytest.fixture(scope="session")
def tiny_pair() -> tuple[Path, Path]:
    """(target, draft) checkpoint directories; trained on first use (a few minutes, cached)."""
    from spectune.engine.zoo.registry import resolve_model

    return resolve_model("tiny-target"), resolve_model("tiny-draft")
