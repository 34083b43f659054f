"""A scenario's runs: every policy under every seed, each seed's arrivals shared by all
policies (common random numbers), with a progress line on long work."""

from __future__ import annotations

import time
from collections.abc import Callable

from spectune.sim.arrivals import arrivals, duration
from spectune.sim.fleet import simulate_run
from spectune.sim.results import SimResult
from spectune.sim.scenario import Policy, Scenario


def simulate(
    scenario: Scenario,
    progress: Callable[[str], None] | None = None,
    policies: list[Policy] | None = None,
    seeds: list[int] | None = None,
    per_iteration: bool = False,
) -> SimResult:
    wall = time.perf_counter()
    policies = policies or scenario.policies
    seeds = seeds or scenario.seeds
    runs = []
    total = len(policies) * len(seeds)
    for s, seed in enumerate(seeds):
        requests = arrivals(scenario, seed)
        seconds = duration(scenario, requests)
        for p, policy in enumerate(policies):
            done = s * len(policies) + p

            label = f"run {done + 1}/{total} ({policy}, seed {seed})"
            tick = _ticker(progress, label, seconds, wall)
            runs.append(
                simulate_run(scenario, policy, seed, requests, seconds, tick, per_iteration)
            )
    pod_seconds = sum(w.pods * w.seconds for r in runs for w in r.windows)
    return SimResult(
        scenario=scenario.name,
        inputs=scenario.model_dump(mode="json"),
        duration_s=seconds,
        window_s=scenario.window_s,
        pod_hours=pod_seconds / 3600,
        wall_seconds=time.perf_counter() - wall,
        runs=runs,
    )


def _ticker(
    progress: Callable[[str], None] | None, label: str, seconds: float, wall: float
) -> Callable[[float], None] | None:
    """A run's progress callback: the share of its virtual time done, as one line."""
    if progress is None:
        return None

    def tick(share: float) -> None:
        elapsed = time.perf_counter() - wall
        progress(f"{label}: {share:.0%} of {seconds / 60:.0f} simulated minutes, {elapsed:.0f} s")

    return tick
