"""`make check` deselects `cluster` and `tools` tests, so a test that uses the cluster or helm
without its marker must fail collection instead of starting them (tests/support/markers.py).
Run on a suite of its own, with stand-ins for the two fixtures that fail if ever set up."""

from __future__ import annotations

import pytest

CONFTEST = """
import pytest

pytest_plugins = ["tests.support.markers"]


@pytest.fixture(scope="session")
def cluster():
    raise AssertionError("the cluster was started")


@pytest.fixture
def admin(cluster):
    return cluster


@pytest.fixture(scope="session")
def helm_binary():
    raise AssertionError("helm was built")
"""
INI = """
[pytest]
addopts = --strict-markers
markers =
    cluster: needs the local cluster
    tools: needs Go-built tools
"""
CHECK = ("-m", "not cluster and not tools")


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makeini(INI)
    return pytester


def test_a_cluster_test_without_its_marker_fails_collection(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        test_unmarked="""
        def test_through_a_fixture(admin):
            pass

        def test_plain():
            pass
        """
    )
    result = suite.runpytest(*CHECK)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_through_a_fixture uses what needs the marker cluster*"])
    assert "test_plain" not in result.stderr.str()
    assert "the cluster was started" not in result.stdout.str()


def test_a_helm_test_without_tools_or_cluster_fails_collection(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        test_helm="""
        import pytest

        @pytest.mark.usefixtures("helm_binary")
        def test_renders():
            pass
        """
    )
    result = suite.runpytest(*CHECK)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_renders uses what needs the marker tools or cluster*"])


def test_marked_tests_are_deselected_and_never_start_anything(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        test_marked="""
        import pytest

        @pytest.mark.cluster
        def test_on_the_cluster(admin):
            pass

        @pytest.mark.tools
        @pytest.mark.usefixtures("helm_binary")
        def test_renders():
            pass

        @pytest.mark.cluster
        @pytest.mark.usefixtures("helm_binary")
        def test_installs(admin):
            pass

        def test_plain():
            pass
        """
    )
    result = suite.runpytest(*CHECK)
    result.assert_outcomes(passed=1, deselected=3)
