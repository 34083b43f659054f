"""The local cluster for tests: reuse one that is up, else start one (building its binaries on
first use, which takes a long while on a cold machine), and stop only what this session started.
Without the binaries or Go to build them, the cluster and operator tests fail: a machine that
cannot run them must not pass as if they had.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.support import REPO, Cluster, cluster_is_up, read_cluster_env, run_visible


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the restart test (down, then a timed warm up) after every other cluster test."""
    items.sort(key=lambda item: getattr(item.module, "__name__", "").endswith(".test_restart"))


def require_cluster_tools(bin_dir: Path, go: str | None) -> None:
    """Fail (never skip) when the cluster's binaries are not built and there is no Go to build
    them, saying how to get them."""
    if go is None and not (bin_dir / "kube-apiserver").exists():
        pytest.fail(
            f"the local cluster's binaries are not in {bin_dir} and Go is not installed to build "
            "them: run .ci/run (it installs Go), or install Go and run `make binaries`",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The running local cluster (see hack/cluster.sh)."""
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
