"""The demo's set-up says which steps are cached before it runs them, so a cold step can warn
that it takes long: the binaries count as cached when this machine built them before, for any
clone (hack/build-binaries.sh keeps them in a per-user store)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from spectune.demo.cluster import REPO, SetUp

BUILD = REPO / "hack" / "build-binaries.sh"


def test_a_step_is_cached_when_its_path_exists_or_its_check_succeeds(tmp_path: Path) -> None:
    assert SetUp("a", ["true"], tmp_path, "").is_cached()
    assert not SetUp("a", ["true"], tmp_path / "missing", "").is_cached()
    assert SetUp("a", ["true"], ["true"], "").is_cached()
    assert not SetUp("a", ["true"], ["false"], "").is_cached()


def test_binaries_with_neither_an_install_nor_a_stored_build_need_compiling(
    tmp_path: Path,
) -> None:
    env = os.environ | {
        "SPECTUNE_TOOLS_CACHE": str(tmp_path / "store"),
        "SPECTUNE_BIN_DIR": str(tmp_path / "bin"),
    }
    check = subprocess.run([str(BUILD), "--check", "helm"], env=env, capture_output=True)
    assert check.returncode == 1 and not check.stdout, check
    assert not (tmp_path / "store").exists()  # a check builds nothing
