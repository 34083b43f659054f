"""How fast spectune-sim simulates a busy fleet: pod-hours per CPU-minute, and where the time goes.

H100 pods serve copies of the Azure trace's busy half hour (about 21 requests/s a pod at 3
copies a pod: running batches of 100 and more, past the issue's "batch 32 or more"), at each
policy asked for. Each run is timed in CPU seconds of the simulation alone (the scenario's
arrivals drawn, the report not written). With `--reference` every run is repeated on the
engine's own per-iteration path (every sequence written every iteration), alternating,
so the ratio compares runs on the same machine at the same time; the two must agree (the
simulator's tests hold them to the same metrics), and this prints whether their results did.
`--profile N` prints the N functions with the most time of one more run of the first policy.
Each run prints its progress to stderr every simulated minute, with the CPU seconds so far.

    .venv/bin/python benchmarks/sim_speed.py                          # 16 pods, 60 s
    .venv/bin/python benchmarks/sim_speed.py --pods 256 --seconds 30  # the 256-pod fleet
    .venv/bin/python benchmarks/sim_speed.py --reference --reps 3     # against the engine's way

Every goodput number the simulator writes is SIMULATED; the times here are this machine's.
Trace: Azure LLM inference trace 2023, Microsoft, CC BY 4.0.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time

from false_rollbacks import busy_h100  # the sibling script's fleet

from spectune.sim.arrivals import Arrival, arrivals, duration
from spectune.sim.fleet import FleetSim
from spectune.sim.results import Run
from spectune.sim.scenario import Policy, Scenario, parse_scenario


def scenario(args: argparse.Namespace) -> Scenario:
    fleet = busy_h100(args.pods, args.copies, args.start, args.seconds)
    fleet["fleet"]["startup_s"] = 0  # busy from the start
    window = args.window or args.seconds
    return parse_scenario(
        fleet | {"name": "sim-speed", "policies": args.policies, "window_s": window}
    )


def timed(
    sc: Scenario, policy: Policy, requests: list[Arrival], per_iteration: bool
) -> tuple[float, Run]:
    """CPU seconds of one run, and the run; its progress to stderr each simulated minute, with
    the CPU seconds so far (where in a long run the time goes)."""

    def progress(done: float) -> None:
        spent = time.process_time() - cpu
        print(f"{policy}: {done:.0%} simulated, {spent:.0f} CPU s", file=sys.stderr)

    length = duration(sc, requests)
    sim = FleetSim(sc, policy, 0, requests, length, progress, per_iteration=per_iteration)
    cpu = time.process_time()
    sim.run()
    seconds = time.process_time() - cpu
    return seconds, sim.result(seconds)


def pod_hours(run: Run) -> float:
    return sum(w.pods * w.seconds for w in run.windows) / 3600


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, default=16)
    p.add_argument("--copies", type=int, help="trace copies overlaid (default: 3 per pod)")
    p.add_argument("--start", type=float, default=1800.0, help="where in the trace to start (s)")
    p.add_argument("--seconds", type=float, default=60.0, help="of trace time")
    p.add_argument("--policies", nargs="+", default=["8", "always"])
    p.add_argument("--window", type=float, help="report window (s; default: the whole run)")
    p.add_argument("--reps", type=int, default=1, help="runs per policy (and path)")
    p.add_argument("--reference", action="store_true", help="also time the per-iteration path")
    p.add_argument("--profile", type=int, default=0, metavar="N")
    args = p.parse_args()
    args.copies = args.copies or 3 * args.pods
    sc = scenario(args)
    requests = arrivals(sc, 0)
    paths = [False, True] if args.reference else [False]
    print(
        f"{args.pods} H100 pods, {args.seconds:.0f} s of the trace from {args.start:.0f} s, "
        f"{args.copies} copies ({len(requests)} requests); CPU seconds of the run alone",
        file=sys.stderr,
    )
    print(
        "| policy | path | mean running batch | pod-hours | CPU s, median (runs) | "
        "pod-hours per CPU-minute | 1 hour of this fleet |"
    )
    print("|---|---|---|---|---|---|---|")
    for policy in sc.policies:
        cpu: dict[bool, list[float]] = {path: [] for path in paths}
        runs: dict[bool, Run] = {}
        for _ in range(args.reps):
            for path in paths:
                seconds, runs[path] = timed(sc, policy, requests, path)
                cpu[path].append(seconds)
        for path in paths:
            run, median = runs[path], statistics.median(cpu[path])
            hours = pod_hours(run)
            batch = statistics.mean(w.mean_running for w in run.windows)
            each = ", ".join(f"{s:.1f}" for s in cpu[path])
            print(
                f"| {policy} | {'per iteration' if path else 'runs'} | {batch:.0f} | "
                f"{hours:.2f} | {median:.1f} ({each}) | {hours / (median / 60):.2f} | "
                f"{args.pods * median / hours / 60:.1f} min |"
            )
        if args.reference:
            ratio = statistics.median(cpu[False]) / statistics.median(cpu[True])
            agree = runs[False].model_dump(exclude={"wall_seconds"}) == runs[True].model_dump(
                exclude={"wall_seconds"}
            )
            print(
                f"\n{policy}: runs / per iteration {ratio:.2f}x the CPU; results "
                f"{'identical' if agree else 'DIFFER (floats may, in their last digits)'}\n"
            )
    if args.profile:
        profile = cProfile.Profile()
        sim = FleetSim(sc, sc.policies[0], 0, requests, duration(sc, requests))
        profile.runcall(sim.run)
        pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
