"""How the draft's catch-up forward lands in the live spec curve: a closed-loop load on the
in-process engine (finished requests are replaced by new ones of 16-64 tokens), then, per
batch bucket, the mean spec step time as the step metrics report it (the draft's prefill
in, the catch-up on plain iterations' tokens apart), without the draft's prefill (what they
reported before issue 31), and with the catch-up added back (before issue 11). One run gives
all three from the Iteration records. `--simulate SKU` times the same run on a simulated
GPU's modelled clock (deterministic, and blind to whatever else the CPU is doing).

Usage: .venv/bin/python benchmarks/catchup_bench.py [--clients 8] [--requests 64]
           [--threshold N] [--exploration 0.1]    (default: always speculate, no exploration)
           [--simulate L4]
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections import defaultdict

from spectune.engine.config import EngineConfig
from spectune.engine.contract import batch_bucket
from spectune.engine.engine import Iteration, LLMEngine
from spectune.engine.gate import GateSettings
from spectune.engine.sequence import SamplingParams
from spectune.engine.zoo.registry import resolve_model
from spectune.engine.zoo.training import corpus, held_out_prompts


def closed_loop(engine: LLMEngine, clients: int, requests: int) -> None:
    """Keep `clients` requests in the engine until `requests` have been sent."""
    _, held_out = corpus()
    prompts = held_out_prompts(held_out, 256, 96)
    rng = random.Random(0)
    sent = 0

    def send() -> None:
        nonlocal sent
        params = SamplingParams(max_tokens=rng.randint(16, 64), ignore_eos=True)
        engine.add_request(prompts[sent % len(prompts)], params)
        sent += 1

    for _ in range(clients):
        send()
    while engine.has_work():
        before = len(engine.scheduler.running) + len(engine.scheduler.waiting)
        engine.step()
        finished = before - len(engine.scheduler.running) - len(engine.scheduler.waiting)
        for _ in range(min(finished, requests - sent)):
            send()


def table(iterations: list[Iteration]) -> list[str]:
    by_bucket: dict[int, list[Iteration]] = defaultdict(list)
    for it in iterations:
        if it.mode == "spec":
            by_bucket[batch_bucket(it.batch_size)].append(it)
    lines = [
        "| bucket | spec steps | with draft prefill | with catch-up | mean ms now "
        "| prefill left out | catch-up included |"
    ]
    lines.append("|---|---|---|---|---|---|---|")
    for bucket, its in sorted(by_bucket.items()):
        now = statistics.mean(it.seconds for it in its)
        without = statistics.mean(it.seconds - it.draft_prefill_seconds for it in its)
        was = statistics.mean(it.seconds + it.catchup_seconds for it in its)
        prefilled = sum(it.draft_prefill_seconds > 0 for it in its)
        caught = sum(it.catchup_seconds > 0 for it in its)
        lines.append(
            f"| {bucket} | {len(its)} | {prefilled} | {caught} | {now * 1e3:.2f} "
            f"| {without * 1e3:.2f} ({without / now:.3f}x) | {was * 1e3:.2f} ({was / now:.3f}x) |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--threshold", type=int, default=None)
    parser.add_argument("--exploration", type=float, default=0.0)
    parser.add_argument("--simulate", metavar="SKU", default=None)
    args = parser.parse_args()
    gate = GateSettings(threshold=args.threshold, exploration=args.exploration)
    config = EngineConfig(
        model="tiny-target", draft="tiny-draft", device="cpu", gate=gate,
        simulate_device=args.simulate,
    )  # fmt: skip
    engine = LLMEngine(config, resolve_model=resolve_model)
    if engine.simulation:
        engine.simulation.hold = False
    closed_loop(engine, args.clients, args.requests)
    print("\n".join(table(list(engine.iterations))))


if __name__ == "__main__":
    main()
