"""How the pod runner turns a pod's container into an engine command line (no cluster needed):
the runner, not the pod, decides the address an engine binds, and mounted files must resolve."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from tests.cluster.support import REPO


def load_runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pod_runner", REPO / "hack" / "pod_runner.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


runner = load_runner()


def test_host_and_port_from_the_pod_are_dropped() -> None:
    argv = [
        "spectune-engine",
        "serve",
        "--model",
        "m",
        "--host",
        "0.0.0.0",
        "--port=80",
        "--k",
        "4",
    ]
    assert runner.strip_flags(argv) == ["--model", "m", "--k", "4"]
    assert runner.strip_flags(["--port", "1", "--method", "ngram"]) == ["--method", "ngram"]


def test_paths_under_mounts_point_at_the_runners_files() -> None:
    mounts = {"/etc/spectune": Path("/s/cfg"), "/etc/spectune/admin": Path("/s/tok")}
    argv = ["--config", "/etc/spectune/engine.yaml", "--admin-token-file=/etc/spectune/admin/t",
            "--model", "/etc/spectunex/m"]  # fmt: skip
    assert runner.rewrite_paths(argv, mounts) == [
        "--config", "/s/cfg/engine.yaml", "--admin-token-file=/s/tok/t",
        "--model", "/etc/spectunex/m",
    ]  # fmt: skip
