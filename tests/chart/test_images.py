"""The images without a container runtime: the operator image's COPY steps and its one install
command, run on the host in a clean virtual environment (downloads from PyPI), give a working
`spectune-operator` and no torch; each image's pinned package set (hack/pin_images.py) resolves
to itself in a clean virtual environment; bases are pinned, users non-root, and the engine's
base agrees with the CUDA its torch wheel brings."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.cluster.support import REPO, load_script

DOCKER = REPO / "docker"
pin_images = load_script("pin_images")


@pytest.mark.slow
def test_operator_install_has_the_operator_and_never_torch(tmp_path) -> None:
    dockerfile = (DOCKER / "operator.Dockerfile").read_text()
    copies = re.findall(r"^COPY (\S+) /src/(\S*)$", dockerfile, re.M)
    (run,) = re.findall(r"(sh /src/docker/install-operator\.sh /src /opt/spectune)", dockerfile)
    src = tmp_path / "src"
    for source, dest in copies:  # as the build stage's COPY lines put them
        if (REPO / source).is_dir():
            shutil.copytree(REPO / source, src / dest, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy(REPO / source, src / dest)
    venv = tmp_path / "opt" / "spectune"
    command = run.replace("/src", str(src)).replace("/opt/spectune", str(venv))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # a fresh machine's python3
    subprocess.run(command, shell=True, check=True, env=env, cwd=tmp_path, timeout=600)
    python = venv / "bin" / "python"
    torch = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True)
    assert torch.returncode != 0 and "No module named 'torch'" in torch.stderr
    crd = subprocess.run(
        [venv / "bin" / "spectune-operator", "crd"], capture_output=True, text=True, check=True
    )
    assert crd.stdout == (REPO / "crds" / "specdeployments.spectune.io.yaml").read_text()
    imports = (
        "import kopf, prometheus_client, prometheus_api_client; import spectune.operator.handlers"
    )
    subprocess.run([python, "-c", imports], check=True, cwd=tmp_path)


def test_images_pin_their_bases_and_packages_and_run_as_non_root() -> None:
    for extra in pin_images.EXTRAS:
        text = (DOCKER / f"{extra}.Dockerfile").read_text()
        assert re.findall(r"^FROM (\S+)", text, re.M) == ["${BASE}"], extra
        # a Debian point release: the python3 whose CPython the pins are resolved for
        assert re.fullmatch(r"debian:12\.\d+-slim", base_of(text)), f"{extra}: {base_of(text)}"
        assert re.search(r"^USER 10001:10001$", text, re.M), extra
        for line in pin_images.pins_path(extra).read_text().splitlines():
            if line and not line.startswith("#"):
                assert re.fullmatch(r"[\w.-]+==[\w.]+", line), line
    engine = (DOCKER / "engine.Dockerfile").read_text()
    assert "--requirement /src/docker/engine-requirements.txt" in engine
    assert "--no-deps '/src[engine]'" in engine  # the project, on the pinned packages
    installer = (DOCKER / "install-operator.sh").read_text()
    assert '--constraint "$src/docker/operator-requirements.txt" "$src[operator]"' in installer
    operator = pin_images.read_pins(pin_images.pins_path("operator"))
    assert not [n for n in operator if n.lower().startswith(("torch", "nvidia"))], operator


def base_of(dockerfile: str) -> str:
    """The image the final stage starts from: its FROM, or the BASE argument's default."""
    base = re.findall(r"^FROM (\S+)", dockerfile, re.M)[-1]
    if base == "${BASE}":
        (base,) = re.findall(r"^ARG BASE=(\S+)$", dockerfile, re.M)
    return base


def cuda_problem(dockerfile: str, pins: dict[str, str]) -> str | None:
    """Why the image's base and its pinned torch disagree on CUDA, or None: an nvidia/cuda base
    must be the CUDA major.minor of the pinned nvidia-cuda-runtime wheel (torch's), and a plain
    base needs that wheel to bring the runtime."""
    base = base_of(dockerfile)
    runtime = [v for n, v in pins.items() if n.lower().replace("_", "-") == "nvidia-cuda-runtime"]
    if not runtime:
        return f"no nvidia-cuda-runtime wheel is pinned: nothing brings CUDA to {base}"
    wheel_cuda = ".".join(runtime[0].split(".")[:2])
    if (match := re.match(r"nvidia/cuda:(\d+\.\d+)", base)) and match[1] != wheel_cuda:
        return f"{base} is CUDA {match[1]}, the pinned torch's runtime wheel CUDA {wheel_cuda}"
    return None


def test_the_engine_base_agrees_with_its_torch_wheels_cuda() -> None:
    pins = pin_images.read_pins(pin_images.pins_path("engine"))
    assert cuda_problem((DOCKER / "engine.Dockerfile").read_text(), pins) is None
    assert "torch" in pins
    stale = {**pins, "nvidia-cuda-runtime": "13.2.86"}
    assert cuda_problem("FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04", stale) == (
        "nvidia/cuda:12.8.1-runtime-ubuntu24.04 is CUDA 12.8, the pinned torch's runtime wheel "
        "CUDA 13.2"
    )
    assert cuda_problem("FROM nvidia/cuda:13.2.0-runtime-ubuntu24.04", stale) is None
    cpu_only = {n: v for n, v in pins.items() if not n.startswith("nvidia-")}
    assert cuda_problem("FROM python:3.12.8-slim-bookworm", cpu_only) == (
        "no nvidia-cuda-runtime wheel is pinned: nothing brings CUDA to python:3.12.8-slim-bookworm"
    )


def _require_index() -> None:
    """Fail at once, saying so, when the package index cannot be reached."""
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    try:
        urllib.request.urlopen(f"{index}/pip/", timeout=15).close()
    except (urllib.error.URLError, TimeoutError) as error:
        pytest.fail(f"the package index {index} is unreachable ({error}): this test resolves "
                    "the images' packages against it", pytrace=False)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("extra", pin_images.EXTRAS)
def test_the_pinned_set_is_what_a_clean_environment_resolves(extra: str, tmp_path: Path) -> None:
    """pip, in a fresh virtual environment, resolves the image's extra under its pins for the
    image's platform: nothing outside the set comes in, no pinned version moves, no pin is
    left over."""
    _require_index()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=120, cwd=tmp_path)
    python = str(venv / "bin" / "python")
    # ensurepip's pip 23 checks Requires-Python against its own interpreter even in a dry run
    upgrade = [python, "-m", "pip", "install", "--quiet", "--upgrade", "pip>=25"]
    subprocess.run(upgrade, check=True, timeout=120, cwd=tmp_path)  # not ours: operator/
    path = pin_images.pins_path(extra)
    resolved = pin_images.resolve([python, "-m", "pip"], extra, path, 300)
    pinned = pin_images.read_pins(path)
    moved = {n: (pinned.get(n), v) for n, v in resolved.items() if pinned.get(n) != v}
    assert not moved, f"(pinned, resolved) versions: rerun hack/pin_images.py {extra}"
    left_over = sorted(pinned.keys() - resolved.keys())
    assert not left_over, f"pinned but not needed: rerun hack/pin_images.py {extra}"
