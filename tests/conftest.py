"""Fixtures every suite may use: the project's own tiny model pair and the local cluster. The
markers plugin fails collection when a test that uses the cluster or helm lacks its marker."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.support import (
    REPO,
    Cluster,
    cluster_is_up,
    read_cluster_env,
    require_cluster_tools,
    run_visible,
)

pytest_plugins = ["pytester", "tests.support.markers", "tests.support.lanes"]


@pytest.fixture(scope="session")
def tiny_pair() -> tuple[Path, Path]:
    """(target, draft) checkpoint directories; trained on first use (a few minutes, cached)."""
    from spectune.engine.zoo.registry import resolve_model

    return resolve_model("tiny-target"), resolve_model("tiny-draft")


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The running local cluster (see hack/cluster.sh): reused when one is up, else started
    (building its binaries on first use, which takes a long while on a cold machine) and
    stopped at the end. Without the binaries or Go to build them the tests fail: a machine that
    cannot run them must not pass as if they had."""
    if cluster_is_up():
        yield read_cluster_env()
        return
    require_cluster_tools(REPO / ".local" / "bin", shutil.which("go"))
    # cluster.sh, not `make cluster-up`: pytest already runs in the installed venv.
    run_visible(request, [str(REPO / "hack" / "cluster.sh"), "up"])
    try:
        yield read_cluster_env()
    finally:
        run_visible(request, [str(REPO / "hack" / "cluster.sh"), "down"])
