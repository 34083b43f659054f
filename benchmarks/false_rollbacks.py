"""How often the goodput check would roll back a threshold change that did nothing.

A fleet serves at a fixed threshold (every number SIMULATED: spectune-sim's roofline of a
well-tuned engine). Every `--window` seconds the operator's reader takes the window it would
verify against; each pair of consecutive windows goes through the check the operator runs
after a change (`autotune.verdict`), as if the threshold had moved from `--threshold` to
`--claimed` between them. The engines never changed, so every roll-back is a false one: what
changing traffic alone makes the check say.

    .venv/bin/python benchmarks/false_rollbacks.py                      # the Azure trace
    .venv/bin/python benchmarks/false_rollbacks.py --copies 6 --pods 2  # a smaller fleet

Trace: Azure LLM inference trace 2023, Microsoft, CC BY 4.0.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import sys

from spectune.operator.autotune import verdict
from spectune.operator.observations import FleetWindow, served
from spectune.sim.arrivals import arrivals, duration
from spectune.sim.fleet import EPOCH, FleetSim
from spectune.sim.scenario import parse_scenario


def busy_h100(pods: int, copies: int, start: float, seconds: float) -> dict:
    """H100 pods (40 GiB of KV each, batches up to 128, an 8B target with a 1B draft at k=4)
    serving `copies` of the Azure trace from `start` for `seconds` (benchmarks/sim_speed.py's
    fleet too)."""
    return {
        "traffic": {
            "name": "azure-conv",
            "copies": copies,
            "start_s": start,
            "duration_s": seconds,
        },
        "acceptance": {"mean": 0.44, "spread": 0.1},
        "fleet": {"pools": [{"sku": "H100", "replicas": pods}], "kv_cache_gib": 40},
        "spec": {
            "model": {"name": "llama-3.1-8b"},
            "engine": {"maxBatchSize": 128},
            "speculation": {"method": "draft", "draft": "llama-3.2-1b", "numSpeculativeTokens": 4},
            "slo": {"ttftMilliseconds": 1000, "tpotMilliseconds": 50},
        },
    }


def scenario(args: argparse.Namespace) -> dict:
    fleet = busy_h100(args.pods, args.copies, args.start, args.seconds)
    fleet["spec"]["tuning"] = {"calibrationWindowSeconds": args.window}
    return fleet | {"name": "false-rollbacks", "policies": [args.threshold], "seeds": [args.seed]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, default=4)
    p.add_argument("--copies", type=int, default=12)
    p.add_argument("--start", type=float, default=0.0, help="where in the trace to start (s)")
    p.add_argument("--seconds", type=float, default=1800.0, help="of trace time")
    p.add_argument("--window", type=int, default=120, help="the calibration window (s)")
    p.add_argument("--threshold", type=int, default=64, help="what the engines run")
    p.add_argument("--claimed", type=int, default=48, help="the change the check is told of")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    sc = parse_scenario(scenario(args))
    requests = arrivals(sc, args.seed)
    sim = FleetSim(sc, args.threshold, args.seed, requests, duration(sc, requests))
    windows: list[FleetWindow] = []

    def read() -> None:
        windows.append(sim.scrapes.read(sim.now, args.window))
        sim.at(sim.now + args.window, read)

    sim.at(EPOCH + 2 * args.window, read)  # the pods warmed up
    sim.run()
    counts: collections.Counter[str] = collections.Counter()
    for i, (before, after) in enumerate(itertools.pairwise(windows)):
        moves = {sku: (args.threshold, args.claimed) for sku in after.skus}
        history = [w.traffic for w in windows[max(0, i - 3) : i + 1]]  # 3 before, and `before`
        check = verdict(before.traffic, served(before.steps), after, moves, history)
        counts[check.verdict] += 1
        if check.verdict == "roll_back":
            print(f"  false roll-back: {check.message}", file=sys.stderr)
    pairs = sum(counts.values())
    print(
        f"SIMULATED: {args.pods} H100 pods, {args.copies} trace copies, {args.seconds:.0f} s, "
        f"{args.window} s windows, engines at {args.threshold}, check told "
        f"{args.threshold} -> {args.claimed}: {pairs} pairs, "
        + ", ".join(f"{k} {v} ({v / pairs:.0%})" for k, v in sorted(counts.items()))
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
