"""One pool against split fleets at equal GPU count: the seed's second remedy. One pool serves
both classes of a scenario (interactive and bulk) under each of the scenario's policies; a
split fleet cuts the same pods in two, routed by class: `n` pods speculate (`auto`, the
operator in the loop) on the interactive requests and the others serve the bulk ones plain.
The two pools of a split share nothing (their own Services and SpecDeployments), so each is a
run of its own on its class's requests; every layout sees the same arrivals per seed.

Every number is SIMULATED (engine/device_time.py's roofline of a well-tuned engine per SKU).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from pydantic import Field

from spectune.sim.arrivals import Arrival, arrivals, duration
from spectune.sim.fleet import simulate_run
from spectune.sim.report import num, ratio, stat, table, times
from spectune.sim.results import Out, Run
from spectune.sim.scenario import Scenario

WORKLOADS = ("interactive", "bulk")


class Layout(Out):
    """One layout of the pods under one seed: per class and window, the requests finished
    within their class's SLO."""

    name: str  # "one pool, auto" or "split 6 + 2"
    seed: int
    interactive_pods: int
    bulk_pods: int
    goodput: dict[str, float]  # class -> SLO-met requests per second over the run
    windows: list[dict[str, float]]  # per report window: class -> SLO-met requests per second
    tpot_p50_ms: dict[str, float]  # class -> median time per output token
    explored_share: float  # of the speculating pods' decode iterations
    threshold_changes: int  # ThresholdChanged Events on the speculating pods


class SplitResult(Out):
    scenario: str
    simulated: bool = True  # always: a modelled clock, not a measurement
    duration_s: float
    window_s: float
    pods: int
    wall_seconds: float
    layouts: list[Layout] = Field(default_factory=list)


def with_pods(scenario: Scenario, pods: int, suffix: str) -> Scenario:
    """The scenario with its one pool at `pods` replicas (its name marks the pool)."""
    pool = scenario.fleet.pools[0].model_copy(update={"replicas": pods})
    fleet = scenario.fleet.model_copy(update={"pools": [pool]})
    return scenario.model_copy(update={"fleet": fleet, "name": f"{scenario.name}-{suffix}"})


Served = list[tuple[Run, tuple[str, ...]]]  # each run with the classes it served


def _windows(runs: Served) -> list[dict[str, float]]:
    """Per window, each class's goodput from the run that served it."""
    count = min(len(run.windows) for run, _ in runs)
    out: list[dict[str, float]] = []
    for i in range(count):
        row = {name: 0.0 for name in WORKLOADS}
        for run, classes in runs:
            w = run.windows[i]
            for workload, met in w.slo_met_by_workload.items():
                if workload in classes:
                    row[workload] += met / max(w.seconds, 1e-9)
        out.append(row)
    return out


def _served(runs: Served, field: str) -> dict[str, float]:
    """Per class, `field` of its Workload in the run that served it."""
    return {
        workload: getattr(w, field)
        for run, classes in runs
        for workload, w in run.workloads.items()
        if workload in classes
    }


def _layout(name: str, seed: int, pods: tuple[int, int], runs: Served) -> Layout:
    speculating = runs[0][0]
    return Layout(
        name=name,
        seed=seed,
        interactive_pods=pods[0],
        bulk_pods=pods[1],
        goodput=_served(runs, "goodput"),
        windows=_windows(runs),
        tpot_p50_ms=_served(runs, "tpot_p50_ms"),
        explored_share=speculating.explored_share,
        threshold_changes=sum(e.reason == "ThresholdChanged" for e in speculating.events),
    )


def compare(
    scenario: Scenario,
    seeds: list[int] | None = None,
    progress: Callable[[str], None] | None = None,
) -> SplitResult:
    """Every policy of the scenario on one pool, and every split of it, under every seed."""
    assert scenario.split is not None, "the scenario names no split"
    wall = time.perf_counter()
    pods = scenario.replicas
    seeds = seeds or scenario.seeds
    layouts: list[Layout] = []
    seconds = 0.0
    for seed in seeds:
        requests = arrivals(scenario, seed)
        seconds = duration(scenario, requests)
        for policy in scenario.policies:
            _say(progress, wall, f"seed {seed}: one pool of {pods}, {policy}")
            run = simulate_run(scenario, policy, seed, requests, seconds)
            layouts.append(_layout(f"one pool, {policy}", seed, (pods, 0), [(run, WORKLOADS)]))
        by_class: dict[str, list[Arrival]] = {
            name: [a for a in requests if a.workload == name] for name in WORKLOADS
        }
        for n in scenario.split.interactive_pods:
            _say(progress, wall, f"seed {seed}: split {n} + {pods - n}")
            fast = simulate_run(
                with_pods(scenario, n, "interactive"), "auto", seed, by_class["interactive"],
                seconds,
            )  # fmt: skip
            plain = simulate_run(
                with_pods(scenario, pods - n, "bulk"), "never", seed, by_class["bulk"], seconds
            )
            runs: Served = [(fast, ("interactive",)), (plain, ("bulk",))]
            layouts.append(_layout(f"split {n} + {pods - n}", seed, (n, pods - n), runs))
    return SplitResult(
        scenario=scenario.name,
        duration_s=seconds,
        window_s=scenario.window_s,
        pods=pods,
        wall_seconds=time.perf_counter() - wall,
        layouts=layouts,
    )


def _say(progress: Callable[[str], None] | None, wall: float, what: str) -> None:
    if progress is not None:
        progress(f"{what} ({time.perf_counter() - wall:.0f} s)")


# --- the report ------------------------------------------------------------------------


def _groups(result: SplitResult) -> dict[str, list[Layout]]:
    out: dict[str, list[Layout]] = {}
    for layout in result.layouts:
        out.setdefault(layout.name, []).append(layout)
    return out


def _total(layout: Layout) -> float:
    return sum(layout.goodput.values())


def render(result: SplitResult) -> str:
    """split.md: goodput per class and layout (mean and 95% interval over seeds), against the
    one pool under `auto`, and per window the layout that served the most."""
    groups = _groups(result)
    reference = "one pool, auto" if "one pool, auto" in groups else next(iter(groups))
    one = groups[reference]
    one_total = stat(map(_total, one)).mean
    rows = []
    for name, layouts in groups.items():
        total = stat(map(_total, layouts))
        rows.append(
            [
                name,
                f"{layouts[0].interactive_pods} + {layouts[0].bulk_pods}",
                *(stat(x.goodput[w] for x in layouts).cell() for w in WORKLOADS),
                total.cell(),
                times(ratio(total.mean, one_total)),
                *(num(stat(x.tpot_p50_ms[w] for x in layouts).mean) for w in WORKLOADS),
                f"{100 * stat(x.explored_share for x in layouts).mean:.2f}%",
            ]
        )
    header = ["layout", "pods (interactive + bulk)", "interactive goodput (req/s)",
              "bulk goodput (req/s)", "total goodput (req/s)", f"total / {reference}",
              "interactive TPOT p50 (ms)", "bulk TPOT p50 (ms)", "explored"]  # fmt: skip
    count = min(len(x.windows) for x in result.layouts)
    names = list(groups)
    window_rows = []
    for i in range(count):
        means = {n: stat(sum(x.windows[i].values()) for x in groups[n]).mean for n in names}
        best = max(names, key=lambda n: means[n])
        window_rows.append([f"{i * result.window_s / 60:.0f} min", *map(num, means.values()), best])
    return (
        "\n\n".join(
            [
                f"# One pool or a split fleet: {result.scenario} (SIMULATED)",
                f"{result.pods} pods in every layout; {len(one)} seed(s); "
                f"{result.duration_s:.0f} s of virtual time per run. Every number is "
                "simulated: a roofline model of a well-tuned engine per GPU SKU, not a "
                "measurement. Goodput counts each class against its own SLO.",
                table(header, rows),
                "## Total goodput per window (req/s, mean over seeds)",
                table(["window", *names, "most"], window_rows),
            ]
        )
        + "\n"
    )


def write(result: SplitResult, out: Path) -> Path:
    """split.json (the whole result) and split.md under `out`; split.md's path."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "split.json").write_text(result.model_dump_json(indent=2) + "\n", encoding="utf-8")
    report = out / "split.md"
    report.write_text(render(result), encoding="utf-8")
    return report
