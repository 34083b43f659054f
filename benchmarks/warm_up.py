"""What the first requests after Ready pay, with `--compile` on the CPU: the engine warmed up by
LLMEngine.warm_up against the warm-up before it (four prompts, speculating, one generate), each
in a fresh process with Inductor's cache emptied. Prints, per warm-up, its seconds and the
seconds of the same request mix served twice (first after Ready, then again: the steady cost).

Usage: python benchmarks/warm_up.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from spectune.engine.config import EngineConfig
from spectune.engine.engine import WARM_UP_PROMPTS, LLMEngine
from spectune.engine.sequence import SamplingParams
from spectune.engine.zoo.registry import resolve_model

MIX = [["def add(a, b):"], ["import os\n", "class A:\n", "for i in range(3):"]]


def one(warm_up: str) -> dict[str, float]:
    config = EngineConfig(
        model=str(resolve_model("tiny-target")),
        draft=str(resolve_model("tiny-draft")),
        device="cpu",
        compile=True,
    )
    engine = LLMEngine(config)
    start = time.monotonic()
    if warm_up == "before":
        engine.generate(list(WARM_UP_PROMPTS), SamplingParams(max_tokens=8, ignore_eos=True))
    else:
        engine.warm_up()
    out = {"warm_up_s": time.monotonic() - start}
    for name in ("first_mix_s", "second_mix_s"):
        start = time.monotonic()
        for prompts in MIX:
            engine.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
        out[name] = time.monotonic() - start
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--one", choices=["before", "after"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return 0
    results: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for _ in range(args.runs):
        for which in results:
            cache = tempfile.mkdtemp()
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            done = subprocess.run(
                [sys.executable, __file__, "--one", which],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            shutil.rmtree(cache)
            results[which].append(json.loads(done.stdout.splitlines()[-1]))
            print(which, results[which][-1], flush=True)
    for which, runs in results.items():
        medians = {k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]}
        print(f"{which}: medians of {len(runs)} runs {medians}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
