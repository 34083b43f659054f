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

from tests.support.ports import free_port

TOKEN = "test-admin-token-5f1c"


@dataclass
class Served:
    url: str
    process: subprocess.Popen
    config: Path
    token_file: Path
    log: Path

    def get(self, path: str, **kw: object) -> httpx.Response:
        return httpx.get(self.url + path, timeout=60, **kw)

    def post(self, path: str, **kw: object) -> httpx.Response:
        return httpx.post(self.url + path, timeout=120, **kw)

    def put_admin(self, body: object, token: str | None = TOKEN) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.put(self.url + "/admin/speculation", json=body, headers=headers, timeout=30)


def start_server(tmp: Path, config: dict, *flags: str) -> Served:
    """Start the server with `config` as its watched YAML file; wait until /readyz says ready."""
    port = free_port()
    config_path = tmp / "engine.yaml"
    config_path.write_text(yaml.safe_dump(config))
    token_file = tmp / "admin-token"
    token_file.write_text(TOKEN + "\n")
    log = tmp / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "spectune.engine.cli",
        "serve",
        "--config",
        str(config_path),
        "--port",
        str(port),
        "--admin-token-file",
        str(token_file),
        *flags,
    ]
    env = os.environ | {"SPECTUNE_CACHE": str(Path(".cache/models").resolve())}
    process = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    served = Served(f"http://127.0.0.1:{port}", process, config_path, token_file, log)
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
