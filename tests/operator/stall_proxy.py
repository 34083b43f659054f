"""A reverse proxy in front of the local kube-apiserver that can hang chosen calls on demand:
the network path between one operator replica and the API server, stalling as it does when a
link or a middlebox does. The replica talks plain HTTP to it on loopback (its kubeconfig's
server), the proxy HTTPS to the API server (its CA checked). A stalled request is held until
`release()` and then dropped, never delivered late: a write that reaches the API server after
the replica gave it up would be the proxy's, not the replica's. Watches stream through.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import socket
import ssl
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# Headers a proxy must not pass on (RFC 9110's hop-by-hop ones, and the framing it redoes).
HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host"}


class StallProxy:
    """`http://127.0.0.1:<port>` in front of `upstream` (https://HOST:PORT, CA file `ca`)."""

    def __init__(self, upstream: str, ca: Path) -> None:
        target = urllib.parse.urlsplit(upstream)
        self.host, self.port = target.hostname or "127.0.0.1", target.port or 443
        self.context = ssl.create_default_context(cafile=str(ca))
        self.pattern: re.Pattern[str] | None = None
        self.methods: set[str] = set()
        self.released = threading.Event()
        self.held: list[tuple[float, str, str]] = []  # (when, method, path) of stalled calls
        self.dropped: list[float] = []  # when each held call was dropped
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _proxy(self) -> None:
                proxy.forward(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _proxy

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stall(self, pattern: str, methods: tuple[str, ...] = ()) -> None:
        """Hang every call whose path matches `pattern` (and whose method is in `methods`,
        when given) from now until `release()`."""
        with self._lock:
            self.released.clear()
            self.pattern, self.methods = re.compile(pattern), set(methods)

    def release(self) -> None:
        """Let calls through again; the held ones are dropped (their connections closed)."""
        with self._lock:
            self.pattern = None
            self.released.set()

    def _stalls(self, method: str, path: str) -> bool:
        with self._lock:
            if self.pattern is None or (self.methods and method not in self.methods):
                return False
            return bool(self.pattern.search(urllib.parse.urlsplit(path).path))

    def forward(self, request: BaseHTTPRequestHandler) -> None:
        method, path = request.command, request.path
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length) if length else None
        if self._stalls(method, path):
            self.held.append((time.monotonic(), method, path))
            self.released.wait()
            self.dropped.append(time.monotonic())
            request.close_connection = True
            with_closed(request.connection)
            return
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        upstream = http.client.HTTPSConnection(self.host, self.port, context=self.context)
        try:
            upstream.request(method, path, body=body, headers=headers)
            answer = upstream.getresponse()
            request.send_response(answer.status, answer.reason)
            for key, value in answer.getheaders():
                if key.lower() not in HOP and key.lower() != "content-length":
                    request.send_header(key, value)
            streamed = answer.getheader("Content-Length") is None
            data = b"" if streamed else answer.read()
            if streamed:
                request.send_header("Transfer-Encoding", "chunked")
            else:
                request.send_header("Content-Length", str(len(data)))
            request.end_headers()
            if not streamed:
                request.wfile.write(data)
                return
            while chunk := answer.read1(65536):  # a watch: pass each piece on as it comes
                request.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                request.wfile.flush()
            request.wfile.write(b"0\r\n\r\n")
        except (OSError, http.client.HTTPException):
            request.close_connection = True
        finally:
            upstream.close()

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


def with_closed(connection: socket.socket) -> None:
    """Close a client's connection at once (a dropped call), whatever state it is in."""
    with contextlib.suppress(OSError):
        connection.shutdown(socket.SHUT_RDWR)
