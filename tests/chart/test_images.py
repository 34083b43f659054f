"""The operator image's install, without a container runtime: the Dockerfile's COPY steps and
its one install command, run on the host in a clean virtual environment (downloads from PyPI),
give a working `spectune-operator` and no torch."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.cluster.support import REPO

DOCKER = REPO / "docker"
pytestmark = pytest.mark.slow


def test_operator_install_has_the_operator_and_never_torch(tmp_path) -> None:
    dockerfile = (DOCKER / "operator.Dockerfile").read_text()
    copies = re.findall(r"^COPY (\S+) /src/(\S*)$", dockerfile, re.M)
    (run,) = re.findall(r"^RUN (sh /src/docker/install-operator\.sh .*)$", dockerfile, re.M)
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


def test_images_pin_their_bases_and_run_as_non_root() -> None:
    for name in ("operator.Dockerfile", "engine.Dockerfile"):
        text = (DOCKER / name).read_text()
        for base in re.findall(r"^FROM (\S+)", text, re.M):
            assert re.search(r":\d+\.\d+\.\d+", base), f"{name}: {base} is not pinned"
        assert re.search(r"^USER 10001:10001$", text, re.M), name
    engine = (DOCKER / "engine.Dockerfile").read_text()
    assert "nvidia/cuda:" in engine and "'/src[engine]'" in engine
    for line in (DOCKER / "operator-constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            assert re.fullmatch(r"[\w.-]+==[\w.]+", line), line
            assert not line.lower().startswith(("torch", "nvidia")), line
