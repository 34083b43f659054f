"""HTTP and streaming overhead: 16 concurrent streams through `spectune-engine serve` vs
the same 16 requests run by the in-process engine, same model, same machine, one run.

Usage: .venv/bin/python benchmarks/server_bench.py [--model M] [--tokens 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from spectune.engine.config import EngineConfig
from spectune.engine.engine import LLMEngine
from spectune.engine.sequence import SamplingParams
from spectune.engine.training import corpus, held_out_prompts

STREAMS = 16


def in_process(model: str, prompts: list[list[int]], tokens: int) -> float:
    engine = LLMEngine(EngineConfig(model=model, device="cpu"))
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    engine.generate(prompts, params)  # warm-up
    start = time.perf_counter()
    engine.generate(prompts, params)
    return STREAMS * tokens / (time.perf_counter() - start)


def stream_one(url: str, model: str, prompt: list[int], tokens: int) -> int:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    used = 0
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as response:
        for line in response.iter_lines():
            if '"usage": {' in line:
                used = int(line.split('"completion_tokens": ')[1].split(",")[0])
    return used


def through_server(model: str, prompts: list[list[int]], tokens: int) -> float:
    port = 18000 + os.getpid() % 1000
    log = Path(tempfile.mkstemp(suffix=".log")[1])
    cmd = [
        sys.executable,
        "-m",
        "spectune.engine.cli",
        "serve",
        "--model",
        model,
        "--port",
        str(port),
        "--device",
        "cpu",
    ]
    server = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                if httpx.get(url + "/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None:
                raise RuntimeError(log.read_text())
            time.sleep(0.2)
        with cf.ThreadPoolExecutor(STREAMS) as pool:
            list(pool.map(lambda p: stream_one(url, model, p, tokens), prompts))  # warm-up
            start = time.perf_counter()
            done = sum(pool.map(lambda p: stream_one(url, model, p, tokens), prompts))
            seconds = time.perf_counter() - start
        assert done == STREAMS * tokens, done
        return done / seconds
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny-target")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    prompts = held_out_prompts(corpus()[1], STREAMS, 64)
    local = [in_process(args.model, prompts, args.tokens) for _ in range(args.repeats)]
    served = [through_server(args.model, prompts, args.tokens) for _ in range(args.repeats)]
    a, b = statistics.median(local), statistics.median(served)
    print(
        f"model {args.model}, {STREAMS} concurrent streams x {args.tokens} tokens, "
        f"median of {args.repeats}"
    )
    print("\n| path | output tokens/s |\n|---|---|")
    print(f"| in-process engine | {a:.1f} |\n| HTTP server, streaming | {b:.1f} |")
    print(f"| ratio server / in-process | {b / a:.3f} |")


if __name__ == "__main__":
    main()
