"""A pytest plugin: `--lane NAME` keeps only that lane's tests, so that `make test`
(hack/test.sh) runs the cluster tests in two lanes at once against one local cluster.

The cluster tests spend most of their time waiting on calibration windows and scrapes, not on
the CPU, so two of them at once take little longer than one. Their operators watch only the
namespaces their own tests create (start_operator insists), so neither lane's operator
reconciles the other's SpecDeployments. The restart test takes the cluster down and up, so it
has a lane of its own, run after the others, as is the RBAC evidence, which reads what the
others' operators called."""

from __future__ import annotations

from fnmatch import fnmatch

import pytest

# lane -> what it holds; a test is in the first lane one of whose patterns its node id matches.
# autotune: the autotuner's two longest end-to-end modules, about as long as all the rest.
LANES = {
    "restart": ("tests/cluster/test_restart.py::*", "tests/operator/test_rbac_evidence.py::*"),
    "autotune": (
        "tests/operator/test_autotune_cluster.py::*",
        "tests/operator/test_autotune_lifecycle.py::*",
    ),
    "wiring": ("*",),
}


def lane_of(nodeid: str) -> str:
    return next(
        lane for lane, patterns in LANES.items() if any(fnmatch(nodeid, p) for p in patterns)
    )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--lane",
        choices=sorted(LANES),
        help="run only this lane's tests: restart (the cluster's restart test and the RBAC "
        "evidence from the others' audit log), autotune (the "
        "autotuner's two longest end-to-end modules) or wiring (every other test)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    lane = config.getoption("lane")
    if lane is None:
        return
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        (kept if lane_of(item.nodeid) == lane else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept
