"""podman as `make images` runs it (hack/podman/containers.conf), for the image tests: the
images hack/images.sh builds, run the way the chart and the operator's engine pods run them
(the image's own user, a read-only root filesystem, writable volumes only where the process
writes, the host's loopback network)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from importlib.metadata import version
from pathlib import Path

from tests.cluster.support import REPO

CONTAINERS_CONF = REPO / "hack" / "podman" / "containers.conf"
IMAGES = ("operator", "engine")


def image(name: str) -> str:
    """The tag hack/images.sh gives an image: the chart's default."""
    return f"ghcr.io/spectune/spectune-{name}:{version('spectune')}"


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def podman(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`podman ARGS`, its output captured; no check (the caller asserts on it)."""
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, env=podman_env()
    )


def run_command(
    tag: str,
    args: Sequence[str],
    *,
    name: str,
    read_only: Mapping[Path, str] = {},
    writable: Sequence[str] = ("/tmp",),
    env: Mapping[str, str] = {},
) -> list[str]:
    """`podman run` of `tag` with `args` as a pod runs it: the image's user, a read-only root,
    `read_only` host paths mounted read-only at their container paths and an empty, writable
    tmpfs at each of `writable` (a pod's emptyDir volumes)."""
    mounts = [a for host, path in read_only.items() for a in ("-v", f"{host}:{path}:ro")]
    volumes = [a for path in writable for a in ("--tmpfs", f"{path}:rw,mode=1777")]
    variables = [a for key, value in env.items() for a in ("-e", f"{key}={value}")]
    return [
        "podman", "run", "--rm", "--name", name, "--network=host", "--read-only",
        *mounts, *volumes, *variables, tag, *args,
    ]  # fmt: skip


def user_and_root(name: str) -> tuple[str, str]:
    """(uid, what writing to the root filesystem says) inside the running container `name`."""
    uid = podman("exec", name, "id", "-u")
    write = podman("exec", name, "sh", "-c", "touch /opt/written 2>&1 || true")
    return uid.stdout.strip(), write.stdout.strip()
