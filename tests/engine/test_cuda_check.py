"""An engine asked for CUDA that torch cannot use exits 2 with one line saying why."""

from __future__ import annotations

import os
import subprocess
import sys

from spectune.engine.cuda_check import cuda_problem


def test_no_problem_off_cuda_or_with_a_usable_gpu() -> None:
    assert cuda_problem(None, "2.15.0", "13.0", available=False) is None
    assert cuda_problem("cpu", "2.15.0", "13.0", available=False) is None
    assert cuda_problem("cuda", "2.15.0", "13.0", available=True) is None


def test_the_line_names_torchs_cuda_and_the_driver_it_needs() -> None:
    line = cuda_problem("cuda", "2.15.0+cu130", "13.0", available=False)
    assert line is not None and "\n" not in line
    assert "torch 2.15.0+cu130 (built for CUDA 13.0)" in line
    assert "driver >= 580" in line
    assert "driver >= 525" in (cuda_problem("cuda:1", "2.5.0", "12.4", False) or "")


def test_a_cpu_build_of_torch_says_it_has_no_cuda() -> None:
    line = cuda_problem("cuda", "2.15.0+cpu", None, available=False)
    assert line is not None and "built without CUDA" in line


def test_serve_exits_2_with_one_line_when_cuda_is_unusable() -> None:
    """No GPU visible (CUDA_VISIBLE_DEVICES empty hides any this machine has)."""
    env = os.environ | {"CUDA_VISIBLE_DEVICES": ""}
    argv = [sys.executable, "-m", "spectune.engine.cli", "serve", "--device", "cuda"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("spectune-engine: error: device cuda asked for, but torch ")
    assert "NVIDIA driver >= " in line or "built without CUDA" in line
