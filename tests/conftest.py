"""Fixtures every suite may use: the project's own tiny model pair, the local cluster and the
images. The markers plugin fails collection when a test that uses the cluster, helm or the
images lacks its marker."""

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
from tests.support.containers import IMAGES, image

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


@pytest.fixture(scope="session")
def images(request: pytest.FixtureRequest) -> dict[str, str]:
    """name -> tag of the two images, built as `make images` builds them (hack/images.sh:
    podman, FROM a Debian made from Debian's packages). Cached layers make it seconds; a cold
    build downloads the engine's CUDA wheels, minutes. Where podman cannot be installed or run
    the tests fail, saying why: they do not skip."""
    run_visible(request, [str(REPO / "hack" / "images.sh")], "images")
    return {name: image(name) for name in IMAGES}
