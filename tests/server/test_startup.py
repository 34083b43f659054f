"""A server whose engine cannot start exits non-zero with the reason, instead of answering
503 on /readyz forever (a pod then restarts and shows why)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.ports import free_port

from .support import TOKEN


def test_serve_exits_with_the_reason_when_its_model_is_missing(tmp_path: Path) -> None:
    token = tmp_path / "admin-token"
    token.write_text(TOKEN)
    missing = tmp_path / "no-such-model"
    done = subprocess.run(
        [sys.executable, "-m", "spectune.engine.cli", "serve", "--model", str(missing),
         "--method", "none", "--port", str(free_port()), "--admin-token-file", str(token)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("spectune-engine: error: the engine did not start: model ")
    assert str(missing) in last and "no such directory" in last


def test_serve_refuses_an_unknown_simulated_sku_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "spectune.engine.cli", "serve", "--port", str(free_port())],
        capture_output=True, text=True, timeout=60,
        env=os.environ | {"SPECTUNE_SIMULATE_DEVICE": "B200"},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("spectune-engine: error: simulate_device: ")
    assert "unknown GPU SKU 'B200'; simulated SKUs: H100 (NVIDIA-H100-80GB-HBM3)" in line
