"""The first thing a GPU user does: `spectune-engine serve` with the default settings (on CUDA:
Flex attention in place, CUDA graphs), one streamed chat completion through the `openai`
client. Prints the seconds from start to Ready and the first request's time to first token
and total latency; exits non-zero, with the server's last lines, when it fails.

Usage: python benchmarks/serve_smoke.py [--device cuda] [--model tiny-target]
       [--draft tiny-draft] [--json OUT]   (hack/gpu-check.sh runs it first)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from openai import OpenAI

READY_TIMEOUT_S = 600  # an 8B model on a GPU: loading plus compiling and capturing


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="tiny-target")
    parser.add_argument("--draft", default="tiny-draft")
    parser.add_argument("--json", type=Path, help="write the numbers here too")
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = Path(tempfile.mkdtemp()) / "serve.log"
    command = [
        sys.executable, "-m", "spectune.engine.cli", "serve", "--model", args.model,
        "--draft", args.draft, "--device", args.device, "--port", str(port),
    ]  # fmt: skip
    # Not from the repository: its operator/ folder shadows the standard library's module in
    # the subprocesses torch starts.
    # the pair cached here (hack/gpu-check.sh carries .cache/models), not one trained anew
    models = os.environ.get("SPECTUNE_CACHE", str(Path(".cache/models").resolve()))
    server = subprocess.Popen(
        command,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        cwd=log.parent,
        env={**os.environ, "SPECTUNE_CACHE": models},
    )
    start = time.monotonic()
    try:
        while True:
            if server.poll() is not None or time.monotonic() - start > READY_TIMEOUT_S:
                tail = "\n".join(log.read_text().splitlines()[-20:])
                print(f"serve-smoke: the server did not become ready:\n{tail}", file=sys.stderr)
                return 1
            try:
                if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        ready_s = time.monotonic() - start
        client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        sent = time.monotonic()
        first = None
        text = []
        stream = client.chat.completions.create(
            model=args.model,
            messages=[{"role": "user", "content": "Write a function that adds two numbers."}],
            max_tokens=64,
            temperature=0,
            stream=True,
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.monotonic()
                text.append(chunk.choices[0].delta.content)
        done = time.monotonic()
    finally:
        server.terminate()
        server.wait(60)
    result = {
        "device": args.device,
        "start_to_ready_s": round(ready_s, 2),
        "first_request_ttft_s": round((first or done) - sent, 3),
        "first_request_s": round(done - sent, 3),
        "characters": len("".join(text)),
    }
    print(
        f"serve-smoke ({args.device}): ready {result['start_to_ready_s']} s after start; first "
        f"request: first token {result['first_request_ttft_s']} s, done "
        f"{result['first_request_s']} s, {result['characters']} characters"
    )
    if args.json:
        args.json.write_text(json.dumps(result))
    return 0 if text else 1


if __name__ == "__main__":
    sys.exit(main())
