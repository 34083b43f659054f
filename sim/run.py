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
) -> SimResult:
    wall = time.perf_counter()
    policies = policies or scenario.policies
    seeds = seeds or scenario.seeds
    seconds = duration(scenario)
    runs = []
    total = len(policies) * len(seeds)
    for s, seed in enumerate(seeds):
        requests = arrivals(scenario, seed)
        for p, policy in enumerate(policies):
            done = s * len(policies) + p

            def tick(
                share: float, policy: Policy = policy, seed: int = seed, done: int = done
            ) -> None:
                if progress:
                    progress(
                        f"run {done + 1}/{total} ({policy}, seed {seed}): {share:.0%} of "
                        f"{seconds / 60:.0f} simulated minutes, {time.perf_counter() - wall:.0f} s"
                    )

            runs.append(simulate_run(scenario, policy, seed, requests, seconds, tick))
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
