"""HTTP and streaming overhead: 16 concurrent streams through `spectune-engine serve` vs
the same 16 requests run by the in-process engine, same model, same machine, one run.

The two sides alternate (in-process, server, in-process, ...) with the server started
once, and the ratio is the median of the per-round ratios, so that other work on a
shared machine falls on both alike. The client is one asyncio event loop reading the
SSE bytes off bare sockets: on a 2-core machine every CPU second a client spends is
taken from the engine, so a heavy client (httpx spends ~0.5 ms per event; 16 of them
per decode step) would measure itself. The `openai` client is exercised by the tests.

Usage: .venv/bin/python benchmarks/server_bench.py [--model M] [--tokens 128] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from spectune.engine.config import EngineConfig
from spectune.engine.engine import LLMEngine
from spectune.engine.sequence import SamplingParams
from spectune.engine.zoo.registry import resolve_model
from spectune.engine.zoo.training import corpus, held_out_prompts

STREAMS = 16


def in_process(model: str, prompts: list[list[int]], tokens: int) -> Callable[[], float]:
    """A warm engine; each call generates the 16 requests and returns output tokens/s."""
    engine = LLMEngine(EngineConfig(model=model, device="cpu"), resolve_model=resolve_model)
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    engine.generate(prompts, params)

    def run() -> float:
        start = time.perf_counter()
        engine.generate(prompts, params)
        return len(prompts) * tokens / (time.perf_counter() - start)

    return run


async def stream_one(port: int, model: str, prompt: list[int], tokens: int) -> int:
    """One streamed completion over a bare socket; returns completion_tokens from the final
    usage chunk. Reading raw bytes keeps the client's CPU share near zero (httpx spends
    about 0.5 ms per event, which on 2 cores is taken from the server)."""
    body = json.dumps(
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head + body)
    received = bytearray()
    while chunk := await reader.read(65536):
        received += chunk
    writer.close()
    status = received[: received.index(b"\r\n")].decode()
    if " 200 " not in status or b"data: [DONE]" not in received[-64:]:
        raise RuntimeError(f"bad stream: {status}")
    usage = received.rindex(b'"usage": {')
    return json.loads(received[usage + 9 : received.index(b"}", usage) + 1])["completion_tokens"]


def through_server(port: int, model: str, prompts: list[list[int]], tokens: int) -> float:
    """16 concurrent streams; output tokens/s, all tokens accounted for."""

    async def run() -> list[int]:
        return await asyncio.gather(*(stream_one(port, model, p, tokens) for p in prompts))

    start = time.perf_counter()
    done = sum(asyncio.run(run()))
    seconds = time.perf_counter() - start
    assert done == len(prompts) * tokens, done
    return done / seconds


def start_server(model: str) -> tuple[subprocess.Popen, int]:
    port = 18000 + os.getpid() % 1000
    log = Path(tempfile.mkstemp(suffix=".log")[1])
    cmd = [sys.executable, "-m", "spectune.engine.cli", "serve", "--model", model]
    cmd += ["--port", str(port), "--device", "cpu"]
    server = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            if httpx.get(url + "/readyz").status_code == 200:
                return server, port
        except httpx.TransportError:
            pass
        if server.poll() is not None:
            raise RuntimeError(log.read_text())
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny-target")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    prompts = held_out_prompts(corpus()[1], STREAMS, 64)
    local = in_process(args.model, prompts, args.tokens)
    server, port = start_server(args.model)
    try:
        through_server(port, args.model, prompts, args.tokens)  # warm-up
        pairs = [
            (local(), through_server(port, args.model, prompts, args.tokens))
            for _ in range(args.repeats)
        ]
    finally:
        server.terminate()
        server.wait(30)
    a = statistics.median(p[0] for p in pairs)
    b = statistics.median(p[1] for p in pairs)
    ratio = statistics.median(s / i for i, s in pairs)
    print(
        f"model {args.model}, {STREAMS} concurrent streams x {args.tokens} tokens, "
        f"{args.repeats} alternating rounds, medians"
    )
    print("\n| path | output tokens/s |\n|---|---|")
    print(f"| in-process engine | {a:.1f} |\n| HTTP server, streaming | {b:.1f} |")
    print(f"| median ratio server / in-process | {ratio:.3f} |")


if __name__ == "__main__":
    main()
