"""Prometheus as hosted ones are reached: the real Prometheus behind its own web config
(TLS with client certificates required, basic auth), and a small proxy that lets a request
through only with a bearer token and an `X-Scope-OrgID`, as Thanos Querier with auth or
Grafana Mimir's gateway would. Both scrape or front what the cluster's hand-configured
Prometheus does, so the engines a test runs are in them."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import bcrypt
import requests
import yaml

from tests.cluster.support import LOCAL
from tests.support.waiting import wait_until

USER = "spectune"


@dataclass(frozen=True)
class Pki:
    """A CA, the server's certificate for 127.0.0.1 and a client's, as files."""

    ca: Path
    server: tuple[Path, Path]  # certificate, key
    client: tuple[Path, Path]


def make_pki(folder: Path) -> Pki:
    """With openssl: EC keys, valid for a day."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=folder)

    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=test-ca")  # fmt: skip
    for name, extra in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "")):
        run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")  # fmt: skip
        (folder / f"{name}.ext").write_text(extra + "\n")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "1",
            "-extfile", f"{name}.ext")  # fmt: skip
    return Pki(
        folder / "ca.crt",
        (folder / "server.crt", folder / "server.key"),
        (folder / "client.crt", folder / "client.key"),
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def secured_prometheus(folder: Path, pki: Pki, password: str) -> Iterator[str]:
    """The cluster's hand-configured scrape configuration in a Prometheus of its own that
    serves only TLS to a client certificate of `pki`'s CA, with basic auth USER/`password`
    (`--web.config.file`). Yields its https URL."""
    web = {
        "tls_server_config": {
            "cert_file": str(pki.server[0]),
            "key_file": str(pki.server[1]),
            "client_auth_type": "RequireAndVerifyClientCert",
            "client_ca_file": str(pki.ca),
        },
        "basic_auth_users": {USER: bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()},
    }
    (folder / "web.yml").write_text(yaml.safe_dump(web))
    port = _free_port()
    log = (folder / "prometheus.log").open("w")
    process = subprocess.Popen(
        [str(LOCAL / "bin" / "prometheus"),
         "--config.file", str(LOCAL / "state" / "prometheus" / "prometheus.yml"),
         "--web.config.file", str(folder / "web.yml"),
         "--web.listen-address", f"127.0.0.1:{port}",
         "--storage.tsdb.path", str(folder / "data")],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"https://127.0.0.1:{port}"

    def ready() -> bool:
        assert process.poll() is None, (folder / "prometheus.log").read_text()[-2000:]
        with contextlib.suppress(requests.RequestException):
            answer = requests.get(
                f"{url}/-/ready", verify=str(pki.ca), cert=pki.client, auth=(USER, password),
                timeout=5,
            )  # fmt: skip
            return answer.status_code == 200
        return False

    try:
        wait_until("the secured Prometheus ready", ready, timeout=60)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


class HeaderProxy:
    """`http://127.0.0.1:<port>` in front of `upstream`, passing a request on only when it
    carries every header of `required` with its value, else answering 401. Counts both."""

    def __init__(self, upstream: str, required: dict[str, str]) -> None:
        self.upstream, self.required = upstream, required
        self.passed = 0
        self.refused: list[str] = []  # what a refused request lacked
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                proxy.forward(self)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def forward(self, handler: BaseHTTPRequestHandler) -> None:
        missing = [k for k, v in self.required.items() if handler.headers.get(k) != v]
        if missing:
            self.refused.append(",".join(missing))
            self._answer(handler, 401, b"unauthorized\n")
            return
        self.passed += 1
        try:
            with urllib.request.urlopen(self.upstream + handler.path, timeout=15) as r:
                self._answer(handler, r.status, r.read())
        except urllib.error.HTTPError as err:
            self._answer(handler, err.code, err.read())

    @staticmethod
    def _answer(handler: BaseHTTPRequestHandler, status: int, body: bytes) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
