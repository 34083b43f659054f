"""A machine that cannot run the cluster tests fails them; it does not skip them (no cluster
needed to check that)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.support import require_cluster_tools


def test_no_binaries_and_no_go_fails_and_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception, match="Go is not installed") as failed:
        require_cluster_tools(tmp_path, go=None)
    assert "make binaries" in str(failed.value)


def test_built_binaries_or_go_are_enough(tmp_path: Path) -> None:
    require_cluster_tools(tmp_path, go="/usr/bin/go")  # it can build them
    (tmp_path / "kube-apiserver").touch()
    require_cluster_tools(tmp_path, go=None)  # they are built
