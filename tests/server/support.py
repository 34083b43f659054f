"""A real `spectune-engine serve` process on a free loopback port, and a client for it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from tests.support.containers import podman_env, run_command
from tests.support.ports import free_port

TOKEN = "test-admin-token-5f1c"


@dataclass
class Served:
    url: str
    process: subprocess.Popen
    config: Path
    token_file: Path
    log: Path
    container: str | None = None  # podman's name for it, when it runs in an image

    def get(self, path: str, **kw: object) -> httpx.Response:
        return httpx.get(self.url + path, timeout=60, **kw)

    def post(self, path: str, **kw: object) -> httpx.Response:
        return httpx.post(self.url + path, timeout=120, **kw)

    def put_admin(self, body: object, token: str | None = TOKEN) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.put(self.url + "/admin/speculation", json=body, headers=headers, timeout=30)


def start_server(tmp: Path, config: dict, *flags: str, image: str | None = None) -> Served:
    """Start the server with `config` as its watched YAML file; wait until /readyz says ready.
    With `image`, the server runs in that engine image (podman, as a pod runs it: read-only
    root, the models read-only at /cache, tmpfs /tmp and /dev/shm)."""
    port = free_port()
    config_path = tmp / "engine.yaml"
    config_path.write_text(yaml.safe_dump(config))
    token_file = tmp / "admin-token"
    token_file.write_text(TOKEN + "\n")
    log = tmp / "server.log"
    models = Path(".cache/models").resolve()
    if image is None:
        cmd = [sys.executable, "-m", "spectune.engine.cli", "serve"]
        env = os.environ | {"SPECTUNE_CACHE": str(models)}
        files, container = tmp, None
    else:
        files = Path("/etc/spectune")
        for path, mode in ((tmp, 0o755), (config_path, 0o644), (token_file, 0o644)):
            path.chmod(mode)  # the image's user reads them, as a pod's does its volumes
        container = f"spectune-test-{tmp.name}-{port}"
        cmd = run_command(
            image,
            ["serve", "--host", "127.0.0.1"],
            name=container,
            read_only={tmp: str(files), models: "/cache"},
            writable=("/tmp", "/dev/shm"),
        )
        env = podman_env()
    cmd += [
        "--config",
        str(files / config_path.name),
        "--port",
        str(port),
        "--admin-token-file",
        str(files / token_file.name),
        *flags,
    ]
    # Not from the repository: its operator/ folder shadows the standard library's module in
    # the subprocesses Python starts, as Inductor's probe of the CPU's vector ISA does.
    process = subprocess.Popen(
        cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=tmp
    )
    served = Served(f"http://127.0.0.1:{port}", process, config_path, token_file, log, container)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{log.read_text()}")
        try:
            if served.get("/readyz").status_code == 200:
                return served
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"server not ready in 180 s:\n{log.read_text()}")


def stop_server(served: Served) -> None:
    if served.process.poll() is None:
        served.process.send_signal(signal.SIGTERM)
        try:
            served.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            served.process.kill()
