"""The local cluster for tests: reuse one that is up, else start one (building its binaries on
first use, which takes a long while on a cold machine), and stop only what this session started.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.cluster.support import REPO, Cluster, cluster_is_up, read_cluster_env, run_visible


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the restart test (down, then a timed warm up) after every other cluster test."""
    items.sort(key=lambda item: getattr(item.module, "__name__", "").endswith(".test_restart"))


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The running local cluster (see hack/cluster.sh)."""
    if cluster_is_up():
        yield read_cluster_env()
        return
    if shutil.which("go") is None and not (REPO / ".local" / "bin" / "kube-apiserver").exists():
        pytest.skip("the cluster binaries are not built and Go is not installed to build them")
    # cluster.sh, not `make cluster-up`: pytest already runs in the installed venv.
    run_visible(request, [str(REPO / "hack" / "cluster.sh"), "up"])
    try:
        yield read_cluster_env()
    finally:
        run_visible(request, [str(REPO / "hack" / "cluster.sh"), "down"])
