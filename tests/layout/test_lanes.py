"""`make test` runs the cluster tests in lanes at once (hack/test.sh, tests/support/lanes.py):
each test runs in exactly one lane, and the restart test, which takes the cluster down, in a
lane of its own. Run on a suite of its own laid out as the repository is."""

from __future__ import annotations

import pytest

from tests.support.lanes import LANES

TEST = """
def test_{name}():
    pass
"""
FILES = {
    "tests/cluster/test_restart.py": "restart",
    "tests/cluster/test_prometheus.py": "wiring",
    "tests/operator/test_autotune_lifecycle.py": "autotune",
    "tests/operator/test_autotune_cluster.py": "autotune",
    "tests/operator/test_autotune_unscraped.py": "wiring",
    "tests/operator/test_operator_cluster.py": "wiring",
    "tests/chart/test_prometheus_operator.py": "wiring",
}


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest('pytest_plugins = ["tests.support.lanes"]')
    for path, lane in FILES.items():
        file = pytester.path / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(TEST.format(name=lane))
    return pytester


@pytest.mark.parametrize("lane", sorted(LANES))
def test_each_lane_runs_only_its_tests(suite: pytest.Pytester, lane: str) -> None:
    result = suite.runpytest("--lane", lane, "-v")
    mine = sum(1 for want in FILES.values() if want == lane)
    result.assert_outcomes(passed=mine, deselected=len(FILES) - mine)
    assert result.stdout.str().count(f"::test_{lane} PASSED") == mine


def test_without_a_lane_every_test_runs(suite: pytest.Pytester) -> None:
    suite.runpytest().assert_outcomes(passed=len(FILES))
