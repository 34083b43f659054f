"""spectune-sim's report: sim.json as simulated, report.md (per policy goodput and decode
tokens/s with intervals over seeds, `auto` against every other policy and against the best
fixed threshold in hindsight, what the operator did) and PNG pictures beside it.

Every number is SIMULATED: engine/device_time.py's roofline of a well-tuned engine on each GPU
SKU drives a virtual clock; nothing was measured on a GPU. The report says so at its top.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from spectune.sim.results import Run, SimResult, ThresholdPoint

SIMULATED = (
    "> **SIMULATED: not a measurement.** Every number below comes from spectune-sim, a "
    "discrete-event model of the fleet whose device times are a roofline model of a "
    "well-tuned engine on each GPU SKU (`engine/device_time.py`). Use it to compare policies "
    "with each other under the same simulated traffic, not as what any GPU delivers."
)

# Student t 0.975 quantiles for 1..30 degrees of freedom (a 95% two-sided interval).
_T975 = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)  # fmt: skip
MAX_ROWS = 60  # of a listing (calibrations, threshold changes): the rest is counted, not shown


def write_report(result: SimResult, out: Path) -> Path:
    """Write sim.json, report.md and the pictures under `out` (created if missing); return
    report.md's path. sim.json is the whole result, so a report can be redrawn from it."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sim.json").write_text(result.model_dump_json(indent=2) + "\n", encoding="utf-8")
    pictures = [plot_windows(result, out / "windows.png")]
    if "auto" in by_policy(result):
        pictures.append(plot_thresholds(result, out / "thresholds.png"))
    report = out / "report.md"
    report.write_text(render(result, [p.name for p in pictures]), encoding="utf-8")
    return report


# --- statistics ------------------------------------------------------------------------


def t975(df: int) -> float:
    """Student t's 0.975 quantile: a table to 30 degrees of freedom, then the Cornish-Fisher
    expansion (within 2e-6 there), so that the simulator needs no scipy."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959963984540054
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


@dataclass(frozen=True)
class Stat:
    """A mean over seeds and its 95% Student t half-width (None with one seed)."""

    mean: float
    half: float | None
    n: int

    def cell(self) -> str:
        return num(self.mean) if self.half is None else f"{num(self.mean)} ± {num(self.half)}"

    def bounds(self) -> tuple[float, float] | None:
        """The interval, its low end clipped at 0: every quantity reported is non-negative."""
        if self.half is None:
            return None
        return max(self.mean - self.half, 0.0), self.mean + self.half

    def interval(self) -> str:
        b = self.bounds()
        return f"{self.n} seed: no interval" if b is None else f"[{num(b[0])}, {num(b[1])}]"


def stat(values: Iterable[float]) -> Stat:
    """Mean and 95% interval of per-seed values: the seeds are independent replications."""
    xs = list(values)
    if not xs:
        return Stat(math.nan, None, 0)
    if len(xs) == 1:
        return Stat(xs[0], None, 1)
    sem = statistics.stdev(xs) / math.sqrt(len(xs))
    return Stat(statistics.fmean(xs), t975(len(xs) - 1) * sem, len(xs))


def ratio(a: float, b: float) -> float | None:
    """a / b, or None where b is zero or either is not a number."""
    if b == 0 or math.isnan(a) or math.isnan(b):
        return None
    return a / b


# --- formatting ------------------------------------------------------------------------


def num(x: float | None) -> str:
    """Three significant figures below 100, whole numbers with separators above."""
    if x is None or math.isnan(x):
        return "n/a"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def times(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.3f}"


def percent(x: float | None) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.2f}%"


def clock(seconds: float) -> str:
    """h:mm:ss of virtual time."""
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def threshold_name(t: int | None) -> str:
    """A threshold as a policy is named: None always speculates, 0 never does."""
    return "always" if t is None else "never" if t == 0 else str(t)


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def capped(rows: list[list[str]], what: str) -> tuple[list[list[str]], str]:
    """At most MAX_ROWS rows, and a line saying how many were left out (sim.json has all)."""
    if len(rows) <= MAX_ROWS:
        return rows, ""
    return rows[:MAX_ROWS], f"\n\n{len(rows) - MAX_ROWS} more {what} in sim.json."


# --- grouping --------------------------------------------------------------------------


def by_policy(result: SimResult) -> dict[str, list[Run]]:
    """Runs per policy in the order first simulated, each policy's runs by seed."""
    groups: dict[str, list[Run]] = {}
    for run in result.runs:
        groups.setdefault(run.policy, []).append(run)
    return {p: sorted(runs, key=lambda r: r.seed) for p, runs in groups.items()}


def is_fixed(policy: str) -> bool:
    """An integer threshold: what "best fixed threshold" chooses among."""
    return policy.isdigit()


def window_count(result: SimResult) -> int:
    return max((len(r.windows) for r in result.runs), default=0)


def window_starts(result: SimResult) -> list[float]:
    """Each window's start, from the run with the most windows: the runs share the windows
    (the same duration and window_s), and a table's rows are aligned by window index."""
    longest = max(result.runs, key=lambda r: len(r.windows), default=None)
    return [] if longest is None else [w.start_s for w in longest.windows]


def window_stat(runs: list[Run], i: int, field: str) -> Stat:
    """A Window field in window `i` over the runs (seeds) that reached it."""
    return stat(getattr(r.windows[i], field) for r in runs if i < len(r.windows))


def best_fixed(groups: dict[str, list[Run]], i: int | None) -> tuple[str, Stat] | None:
    """The integer policy with the highest mean goodput in window `i` (over the run: None),
    known only in hindsight; None when no fixed threshold was simulated."""
    fixed = [p for p in groups if is_fixed(p)]
    if not fixed:
        return None
    scored = [(p, goodput_stat(groups[p], i)) for p in fixed]
    return max(scored, key=lambda ps: -math.inf if math.isnan(ps[1].mean) else ps[1].mean)


def goodput_stat(runs: list[Run], i: int | None) -> Stat:
    if i is None:
        return stat(r.goodput for r in runs)
    return window_stat(runs, i, "goodput")


# --- report.md -------------------------------------------------------------------------


def render(result: SimResult, pictures: list[str]) -> str:
    """The whole report.md: the SIMULATED label first, then policies, windows, the operator."""
    groups = by_policy(result)
    parts = [
        f"# spectune-sim: {result.scenario} (SIMULATED)",
        SIMULATED,
        overview(result, groups),
        overall(groups),
        versus(groups),
        per_window(result, groups, "Goodput per window (SLO-met requests/s)", "goodput"),
        per_window(result, groups, "Decode tokens/s per window", "decode_tokens_per_s"),
        per_window(
            result,
            groups,
            "Median time per output token per window (ms; the latency a policy moves when "
            "every policy meets the load)",
            "tpot_p50_ms",
        ),
        versus_windows(result, groups),
        *[f"![{name} (simulated)]({name})" for name in pictures],
        operator_section(result, groups),
        cost(result),
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


def overview(result: SimResult, groups: dict[str, list[Run]]) -> str:
    """What was simulated: a reader checks the set-up before the numbers."""
    seeds = sorted({r.seed for r in result.runs})
    return "\n".join(
        [
            f"- virtual time per run: {clock(result.duration_s)} "
            f"({window_count(result)} windows of {result.window_s:g} s)",
            f"- policies: {', '.join(groups) or 'none'}",
            f"- seeds: {', '.join(map(str, seeds)) or 'none'} (the same arrivals per seed "
            "across policies)",
            "- intervals: 95% Student t over seeds"
            + (" (1 seed: no interval)" if len(seeds) == 1 else ""),
            "- goodput: requests answered within the SLO per second of virtual time",
        ]
    )


def overall(groups: dict[str, list[Run]]) -> str:
    """Per policy over the whole run, with intervals as their own columns."""
    rows = []
    for policy, runs in groups.items():
        good = stat(r.goodput for r in runs)
        tokens = stat(r.decode_tokens_per_s for r in runs)
        rejected = stat(r.rejected / r.requests if r.requests else 0.0 for r in runs)
        explored = stat(r.explored_share for r in runs)
        rows.append(
            [policy, str(good.n), num(good.mean), good.interval(), num(tokens.mean),
             tokens.interval(), percent(rejected.mean), percent(explored.mean)]
        )  # fmt: skip
    header = ["policy", "seeds", "goodput (req/s)", "95% interval", "decode tok/s"]
    header += ["95% interval", "rejected", "explored"]
    return "## Per policy, whole run\n\n" + table(header, rows)


def versus(groups: dict[str, list[Run]]) -> str:
    """auto over each other policy and over the best fixed threshold, as ratios of means."""
    if "auto" not in groups:
        return "## auto against the others\n\nNo `auto` run in this result."
    auto = groups["auto"]
    rows = []
    for policy, runs in groups.items():
        if policy == "auto":
            continue
        rows.append([policy, *_ratios(auto, runs)])
    best = best_fixed(groups, None)
    if best is not None:
        rows.append([f"best fixed in hindsight ({best[0]})", *_ratios(auto, groups[best[0]])])
    head = "## auto against the others, whole run (ratio of means over seeds)"
    note = (
        "Paired: auto's goodput over the policy's in each seed (both served the same "
        "arrivals), their mean and 95% interval: an interval reaching 1.000 does not tell "
        "auto from the policy at these seeds."
    )
    header = ["auto / policy", "goodput", "goodput, paired per seed", "decode tok/s"]
    return f"{head}\n\n{note}\n\n" + table(header, rows)


def _ratios(auto: list[Run], other: list[Run]) -> list[str]:
    """auto's mean over the other's, goodput (and paired per seed) then decode tokens/s."""
    fields = ("goodput", "decode_tokens_per_s")
    good, tokens = (times(ratio(mean_of(auto, f), mean_of(other, f))) for f in fields)
    return [good, paired(auto, other), tokens]


def paired(auto: list[Run], other: list[Run]) -> str:
    """auto's goodput over the other policy's seed by seed (seeds where the other served
    any): mean [95% interval]."""
    theirs = {r.seed: r.goodput for r in other}
    s = stat(r.goodput / theirs[r.seed] for r in auto if theirs.get(r.seed))
    b = s.bounds()
    if b is None:
        return "n/a" if s.n == 0 else f"{times(s.mean)} (1 seed)"
    return f"{times(s.mean)} [{times(b[0])}, {times(b[1])}]"


def mean_of(runs: list[Run], field: str) -> float:
    return stat(getattr(r, field) for r in runs).mean


def per_window(result: SimResult, groups: dict[str, list[Run]], title: str, field: str) -> str:
    """One row per window, mean ± half-width per policy; the goodput table adds the best fixed
    threshold in that window (in hindsight) and auto's ratio to it."""
    with_best = field == "goodput"
    header = ["window start", *groups]
    if with_best:
        header += ["best fixed (req/s)", "auto / best fixed"]
    rows = []
    for i, start in enumerate(window_starts(result)):
        row = [clock(start)]
        row += [window_stat(rs, i, field).cell() for rs in groups.values()]
        if with_best:
            row += _best_cells(groups, i)
        rows.append(row)
    return f"## {title}\n\n" + table(header, rows)


def _best_cells(groups: dict[str, list[Run]], i: int) -> list[str]:
    best = best_fixed(groups, i)
    if best is None:
        return ["no fixed threshold run", "n/a"]
    policy, good = best
    auto = goodput_stat(groups["auto"], i).mean if "auto" in groups else math.nan
    return [f"{policy} ({num(good.mean)})", times(ratio(auto, good.mean))]


def versus_windows(result: SimResult, groups: dict[str, list[Run]]) -> str:
    """auto / each other policy per window, goodput then decode tokens/s."""
    if "auto" not in groups or len(groups) < 2:
        return ""
    others = [p for p in groups if p != "auto"]
    auto = groups["auto"]
    rows = []
    for i, start in enumerate(window_starts(result)):
        row = [clock(start)]
        for p in others:
            good = ratio(goodput_stat(auto, i).mean, goodput_stat(groups[p], i).mean)
            tok = ratio(
                window_stat(auto, i, "decode_tokens_per_s").mean,
                window_stat(groups[p], i, "decode_tokens_per_s").mean,
            )
            row.append(f"{times(good)} / {times(tok)}")
        rows.append(row)
    head = "## auto / each policy per window (goodput / decode tok/s, ratio of means)"
    return f"{head}\n\n" + table(["window start", *[f"auto / {p}" for p in others]], rows)


# --- the operator (auto runs) ------------------------------------------------------------


def threshold_steps(run: Run) -> int:
    """Steps in the threshold timeline: points whose threshold differs from the SKU's previous
    point. A SKU's first point is the operator's first word, not a step (the timeline records a
    point when the threshold or the crossover it targets changes)."""
    last: dict[str, int | None] = {}
    steps = 0
    for p in sorted(run.thresholds, key=lambda p: p.at_s):
        steps += p.sku in last and p.threshold != last[p.sku]
        last[p.sku] = p.threshold
    return steps


def events_named(run: Run, reason: str) -> int:
    return sum(e.reason == reason for e in run.events)


def final_thresholds(run: Run) -> str:
    if not run.windows or not run.windows[-1].thresholds:
        return "n/a"
    ends = run.windows[-1].thresholds
    return ", ".join(f"{sku} {threshold_name(t)}" for sku, t in sorted(ends.items()))


def operator_section(result: SimResult, groups: dict[str, list[Run]]) -> str:
    """What the operator did in the auto runs: a summary per seed, its calibrations, its
    threshold changes with the crossovers it measured, and what exploring cost."""
    auto = groups.get("auto")
    if not auto:
        return ""
    hours = result.duration_s / 3600
    rows = [
        [str(r.seed), str(events_named(r, "ThresholdChanged")), str(threshold_steps(r)),
         str(events_named(r, "RolledBack")), str(len(r.calibrations)),
         percent(r.explored_share), str(r.prometheus_queries),
         num(r.prometheus_queries / hours) if hours else "n/a", final_thresholds(r)]
        for r in auto
    ]  # fmt: skip
    header = ["seed", "ThresholdChanged", "timeline steps", "RolledBack", "calibrations"]
    header += ["explored share"]
    header += ["Prometheus queries", "queries / virtual hour", "thresholds at the end"]
    explored = stat(r.explored_share for r in auto)
    parts = [
        "## The operator (auto runs)",
        table(header, rows),
        "ThresholdChanged and RolledBack: the operator's Events of those reasons. Timeline "
        "steps: points of the threshold timeline below whose threshold differs from the SKU's "
        "previous point (a rollback is one too; a SKU's first point is not).",
        f"Exploration ran {percent(explored.mean)} of decode iterations in the mode the gate "
        f"did not pick (mean over seeds; {_percent_interval(explored)}).",
        calibrations(auto),
        threshold_listing(auto),
        exploration_cost(result, groups),
    ]
    return "\n\n".join(p for p in parts if p)


def _percent_interval(s: Stat) -> str:
    b = s.bounds()
    if b is None:
        return f"{s.n} seed: no interval"
    return f"95% interval [{percent(b[0])}, {percent(min(b[1], 1.0))}]"


def calibrations(auto: list[Run]) -> str:
    """Each calibration: its trigger, start, the time to a decision and how it ended."""
    rows = [
        [str(r.seed), c.trigger, clock(c.started_s),
         "still running" if c.decided_s is None else f"{c.decided_s - c.started_s:.0f} s",
         c.outcome]
        for r in auto
        for c in sorted(r.calibrations, key=lambda c: c.started_s)
    ]  # fmt: skip
    if not rows:
        return "### Calibrations\n\nNone."
    rows, more = capped(rows, "calibrations")
    header = ["seed", "trigger", "started", "decision time", "outcome"]
    return "### Calibrations\n\n" + table(header, rows) + more


def threshold_listing(auto: list[Run]) -> str:
    """Every recorded threshold per SKU over time, with the crossover measured."""
    rows = [
        [str(r.seed), clock(p.at_s), p.sku, threshold_name(p.threshold),
         "-" if p.crossover is None else f"{p.crossover:.1f}"]
        for r in auto
        for p in sorted(r.thresholds, key=lambda p: (p.at_s, p.sku))
    ]  # fmt: skip
    if not rows:
        return "### Thresholds over time\n\nNo threshold recorded."
    rows, more = capped(rows, "threshold points")
    header = ["seed", "at", "SKU", "threshold", "measured crossover (batch)"]
    return "### Thresholds over time\n\n" + table(header, rows) + more


def steady(run: Run, i: int, window_s: float) -> bool:
    """Window `i` of `run` ran one threshold throughout: no recorded change inside it and the
    same thresholds at its end as at the previous window's end."""
    start, end = i * window_s, (i + 1) * window_s
    if any(start <= p.at_s < end for p in run.thresholds):
        return False
    return i > 0 and run.windows[i].thresholds == run.windows[i - 1].thresholds


def exploration_cost(result: SimResult, groups: dict[str, list[Run]]) -> str:
    """Approximate what exploring cost in goodput, two ways, both over windows where auto's
    thresholds were steady (so a threshold being moved is not what is measured)."""
    lines = ["### What exploration cost (approximate)", paired_cost(result, groups)]
    lines.append(hindsight_cost(result, groups))
    return "\n\n".join(lines)


def paired_cost(result: SimResult, groups: dict[str, list[Run]]) -> str:
    """auto against the fixed policy running the very threshold auto held, same seed (same
    arrivals), window by window: the difference is exploration's (and the gate's noise)."""
    auto_sum = fixed_sum = explored = 0.0
    pairs = 0
    for run in groups["auto"]:
        for i, w in enumerate(run.windows):
            if not steady(run, i, result.window_s) or len(set(w.thresholds.values())) != 1:
                continue
            policy = threshold_name(next(iter(w.thresholds.values())))
            twin = next((r for r in groups.get(policy, []) if r.seed == run.seed), None)
            if twin is None or i >= len(twin.windows):
                continue
            auto_sum += w.goodput
            fixed_sum += twin.windows[i].goodput
            explored += w.explored_share
            pairs += 1
    if not pairs:
        return (
            "Paired with the same fixed threshold: no window where auto held one threshold on "
            "every SKU, steady, and that threshold was also simulated as a fixed policy."
        )
    r = ratio(auto_sum, fixed_sum)
    return (
        f"Paired with the same fixed threshold: in {pairs} window(s) where auto held one "
        "threshold on every SKU throughout (no change recorded in the window, the same at its "
        "end as at the previous end) and that threshold was also run as a fixed policy with "
        f"the same seed, auto's goodput summed to {times(r)} x the fixed policy's "
        f"({_cost(r)}), exploring {percent(explored / pairs)} of decode iterations there."
    )


def hindsight_cost(result: SimResult, groups: dict[str, list[Run]]) -> str:
    """auto's mean goodput against the best fixed threshold in hindsight per window, over the
    windows steady in every auto seed: an upper bound that also counts a threshold set off
    the best one, not only exploring."""
    head = "Against the best fixed threshold in hindsight: "
    if not any(is_fixed(p) for p in groups):
        return head + "no fixed threshold was simulated, so not computed."
    auto = groups["auto"]
    windows = [
        i
        for i in range(window_count(result))
        if all(i < len(r.windows) and steady(r, i, result.window_s) for r in auto)
    ]
    if not windows:
        return head + "no window where auto's thresholds were steady in every seed."
    a = sum(goodput_stat(auto, i).mean for i in windows)
    b = sum(best_mean(groups, i) for i in windows)
    r = ratio(a, b)
    return head + (
        f"over the {len(windows)} window(s) where auto's thresholds were steady in every "
        f"seed, auto's mean goodput summed to {times(r)} x that of the best integer policy of "
        f"each window ({_cost(r)}). This also counts any threshold auto held away from the "
        "best one, so it bounds exploration's cost from above."
    )


def best_mean(groups: dict[str, list[Run]], i: int) -> float:
    best = best_fixed(groups, i)
    return math.nan if best is None else best[1].mean


def _cost(r: float | None) -> str:
    if r is None:
        return "cost n/a"
    return f"a cost of {percent(1 - r)}" if r <= 1 else f"a gain of {percent(r - 1)}"


def cost(result: SimResult) -> str:
    """What the simulation itself cost in CPU time, for sizing the next one."""
    minutes = result.wall_seconds / 60
    rate = num(result.pod_hours / minutes) if minutes > 0 else "n/a"
    runs = sum(r.wall_seconds for r in result.runs)
    iterations = sum(r.iterations for r in result.runs)
    return "\n".join(
        [
            "## What the simulation cost",
            "",
            f"- wall time: {result.wall_seconds:.1f} s for {len(result.runs)} runs "
            f"(their own times sum to {runs:.1f} s)",
            f"- virtual pod-hours simulated: {num(result.pod_hours)} "
            f"({iterations:,} decode iterations)",
            f"- pod-hours simulated per CPU-minute: {rate} (pod-hours / (wall seconds / 60))",
        ]
    )


# --- pictures ----------------------------------------------------------------------------


def pyplot():
    """matplotlib on the Agg backend, imported here: a report without pictures (and the
    simulator itself) never loads it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_windows(result: SimResult, path: Path) -> Path:
    """Goodput and decode tokens/s per window per policy: the mean over seeds as a line, its
    95% interval as a band (none with one seed)."""
    plt = pyplot()
    fig, (good, tokens) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    mids = [(s + result.window_s / 2) / 60 for s in window_starts(result)]
    for policy, runs in by_policy(result).items():
        for ax, field in ((good, "goodput"), (tokens, "decode_tokens_per_s")):
            stats = [window_stat(runs, i, field) for i in range(len(mids))]
            line = ax.plot(mids, [s.mean for s in stats], "o-", markersize=3, label=policy)
            bands = [s.bounds() for s in stats]
            if bands and all(b is not None for b in bands):
                lo, hi = zip(*bands, strict=True)  # type: ignore[misc]
                ax.fill_between(mids, lo, hi, color=line[0].get_color(), alpha=0.15)
    good.set_ylabel("goodput (SLO-met req/s)")
    tokens.set_ylabel("decode tokens/s")
    tokens.set_xlabel("virtual time (min)")
    tokens.set_xlim(0, max(result.duration_s, 1.0) / 60)
    good.set_title(f"{result.scenario}: SIMULATED, mean over seeds with 95% interval")
    good.legend(fontsize=8, ncol=2)
    return save(fig, path)


def plot_thresholds(result: SimResult, path: Path) -> Path:
    """auto's threshold per SKU over time as steps (every seed overlaid, one colour per SKU),
    the crossovers it measured as crosses; "always" drawn above the largest threshold."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    auto = by_policy(result).get("auto", [])
    points = [p for r in auto for p in r.thresholds]
    finite = [p.threshold for p in points if p.threshold is not None]
    finite += [p.crossover for p in points if p.crossover is not None]
    top = max(finite, default=1) * 1.25 or 1.0
    colours: dict[str, str] = {}
    for n, run in enumerate(auto):
        for sku, series in sorted(per_sku(run.thresholds).items()):
            _step(ax, sku, series, result.duration_s, top, colours, alpha=1.0 if n == 0 else 0.5)
    if any(p.threshold is None for p in points):
        ax.axhline(top, color="grey", linewidth=0.8, linestyle=":")
        ax.annotate("always", (0, top), textcoords="offset points", xytext=(2, 3), fontsize=8)
    if not points:
        ax.text(0.5, 0.5, "no threshold recorded", transform=ax.transAxes, ha="center")
    ax.set_ylim(bottom=0, top=top * 1.1)
    ax.set_xlim(0, result.duration_s / 60)
    ax.set_xlabel("virtual time (min)")
    ax.set_ylabel("threshold (running batch)")
    seeds = f"{len(auto)} seeds overlaid" if len(auto) > 1 else "1 seed"
    ax.set_title(f"auto: threshold per SKU (steps), measured crossover (x); SIMULATED, {seeds}")
    if colours:
        ax.legend(fontsize=8)
    return save(fig, path)


def per_sku(points: list[ThresholdPoint]) -> dict[str, list[ThresholdPoint]]:
    series: dict[str, list[ThresholdPoint]] = {}
    for p in sorted(points, key=lambda p: p.at_s):
        series.setdefault(p.sku, []).append(p)
    return series


def _step(ax, sku, series, duration_s, top, colours, alpha) -> None:
    """One SKU's thresholds of one run, held to the end of the run."""
    ys = [top if p.threshold is None else p.threshold for p in series]
    xs = [p.at_s / 60 for p in series] + [max(duration_s, series[-1].at_s) / 60]
    label = None if sku in colours else sku
    line = ax.step(xs, [*ys, ys[-1]], where="post", color=colours.get(sku), alpha=alpha,
                   label=label)  # fmt: skip
    colours.setdefault(sku, line[0].get_color())
    crossed = [(p.at_s / 60, p.crossover) for p in series if p.crossover is not None]
    if crossed:
        ax.plot(*zip(*crossed, strict=True), "x", color=colours[sku], alpha=alpha)
