"""The bench's report: bench.json (the result, see bench_schema), bench.md (tables a
person reads, with the machine and the baselines beside every number) and PNG plots
(speedup vs batch size with the crossover marked; goodput vs load per policy).
"""

from __future__ import annotations

from pathlib import Path

from spectune.engine.bench.schema import (
    BatchSweep,
    BenchResult,
    BucketPoint,
    CrossoverResult,
    Latency,
    LoadSweep,
    Roofline,
    TraceReplay,
    Verdict,
)
from spectune.engine.bench.trace import describe_replay

POLICY_ORDER = ("never", "always", "gated", "current")


def write_report(result: BenchResult, out: Path) -> list[Path]:
    """Write every part that has data; returns the paths, bench.json first."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "bench.json", out / "bench.md"]
    paths[0].write_text(result.model_dump_json(indent=2) + "\n")
    paths[1].write_text(markdown(result))
    if result.batch_sweep and result.batch_sweep.points:
        paths.append(plot_speedup(result, out / "speedup.png"))
    if result.load_sweep and result.load_sweep.levels:
        paths.append(plot_goodput(result.load_sweep, out / "goodput.png"))
    if result.trace and result.trace.runs:
        paths.append(plot_trace(result.trace, out / "trace.png"))
    return paths


def describe_crossover(c: CrossoverResult) -> str:
    if c.status == "crosses":
        return (
            f"speedup crosses 1.0 at batch {c.batch:.2f} (bucket {c.bucket}); "
            f"recommended threshold {c.threshold} (speculate while batch < {c.threshold})"
        )
    if c.status == "never_pays":
        return (
            f"speculation does not pay even at batch {c.batch:g}, the smallest measured; "
            "recommended threshold 0 (never)"
        )
    if c.status == "always_pays":
        return (
            f"speculation pays up to batch {c.batch:g}, the largest measured (crossover above "
            "it); recommended: no threshold (always)"
        )
    return "unknown: no batch bucket was measured in both modes"


# --- markdown ------------------------------------------------------------------------


def markdown(r: BenchResult) -> str:
    parts = [_header(r)]
    if r.batch_sweep:
        parts.append(_batch_section(r.batch_sweep))
    if r.roofline:
        parts.append(_roofline_section(r.roofline))
    if r.load_sweep:
        parts.append(_load_section(r.load_sweep, r.crossover_agreement_buckets))
    if r.verdict:
        parts.append(_verdict_section(r.verdict))
    if r.trace:
        parts.append(_trace_section(r.trace))
    return "\n\n".join(parts) + "\n"


def _header(r: BenchResult) -> str:
    m, t = r.machine, r.target
    what = t.url or f"{t.model}" + (f" + {t.draft}" if t.draft else "")
    status = "complete" if r.status == "complete" else f"**incomplete**: {r.error}"
    return "\n".join(
        [
            "# spectune bench",
            "",
            f"- status: {status}",
            f"- target: {what} (method {t.method}, k = {t.k})",
            f"- machine: {m.cpu}, {m.cores} cores, device {m.device}, torch {m.torch} "
            f"({m.torch_threads} threads), Python {m.python}; load average at start "
            f"{', '.join(map(str, m.load_average))}",
            f"- started: {r.started_at}",
            f"- command: `{r.command}`",
        ]
    )


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _num(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def _point_rows(points: list[BucketPoint]) -> list[list[str]]:
    return [
        [
            str(p.batch),
            f"{p.plain_step_ms:.2f}",
            f"{p.spec_step_ms:.2f}",
            f"{p.spec_tokens_per_step:.2f}",
            f"{p.plain_tokens_per_s:.0f}",
            f"{p.spec_tokens_per_s:.0f}",
            f"**{p.speedup:.2f}**",
        ]
        for p in points
    ]


POINT_HEADER = [
    "batch",
    "plain ms/step",
    "spec ms/step",
    "spec tokens/step",
    "plain tok/s",
    "spec tok/s",
    "speedup",
]


def _batch_section(b: BatchSweep) -> str:
    return "\n\n".join(
        [
            "## Crossover: the per-batch sweep",
            f"At least {b.iterations_per_mode} timed decode iterations per mode and batch size, "
            f"modes alternating; median step times; prompts of {b.prompt_tokens} tokens; "
            f"acceptance {_num(b.acceptance)}. Baseline: plain decode at the same batch size, "
            "same run.",
            markdown_table(POINT_HEADER, _point_rows(b.points)),
            f"Crossover: {describe_crossover(b.crossover)}.",
        ]
    )


def _roofline_section(r: Roofline) -> str:
    row = [
        f"{r.weight_bytes / 1e6:.1f} MB",
        f"{r.copy_bandwidth_gb_s:.1f} GB/s",
        f"{r.roofline_ms:.3f}",
        f"{r.plain_step_ms:.3f}",
        f"**{r.ratio:.1f}x**",
    ]
    header = ["target weights", "copy bandwidth", "roofline ms", "plain step ms, batch 1", "ratio"]
    return "## Batch-1 decode vs the memory roofline\n\n" + markdown_table(header, [row])


def _lat(x: Latency) -> str:
    return f"{_num(x.p50, '.1f')} / {_num(x.p99, '.1f')}"


def _load_section(s: LoadSweep, agreement: int | None) -> str:
    unit = "clients" if s.kind == "closed" else "req/s"
    header = [
        f"load ({unit})",
        "policy",
        "goodput req/s",
        "tok/s",
        "TTFT p50/p99 ms",
        "TPOT p50/p99 ms",
        "ITL p50/p99 ms",
        "e2e p50/p99 ms",
        "acceptance",
        "mean batch",
        "ok/sent",
    ]
    levels = sorted(s.levels, key=lambda v: (v.load, POLICY_ORDER.index(v.policy)))
    rows = [
        [
            f"{v.load:g}",
            v.policy + ("" if v.policy != "gated" else f" ({v.threshold})"),
            f"{v.goodput_rps:.3f}",
            f"{v.output_tokens_per_s:.0f}",
            _lat(v.ttft_ms),
            _lat(v.tpot_ms),
            _lat(v.itl_ms),
            _lat(v.e2e_ms),
            _num(v.acceptance),
            _num(v.mean_batch, ".1f"),
            f"{v.ok}/{v.requests}",
        ]
        for v in levels
    ]
    text = [
        f"## Load sweep ({s.kind} loop)",
        f"SLO: TTFT <= {s.slo.ttft_ms} ms and TPOT <= {s.slo.tpot_ms} ms; output lengths "
        f"{s.output_lengths}; prompts: {s.prompts}; gated threshold {s.gated_threshold} "
        f"(from {s.threshold_source.replace('_', ' ')}).",
        markdown_table(header, rows),
        f"Crossover from the load sweep's own decode steps: {describe_crossover(s.crossover)}.",
    ]
    if s.points:
        text.append(markdown_table(POINT_HEADER, _point_rows(s.points)))
    if agreement is not None:
        text.append(f"The two crossovers are {agreement} bucket(s) apart.")
    return "\n\n".join(text)


def _verdict_section(v: Verdict) -> str:
    rows = [[f"{r.load:g}", _num(r.ratio, ".3f")] for r in v.ratios]
    totals = ", ".join(f"{k} {x:.3f}" for k, x in v.totals.items())
    claim = "holds" if v.holds else "does not hold"
    return "\n\n".join(
        [
            "## The gate's claim",
            f"Gated goodput >= {v.floor} x the better of never/always at every load, and "
            f"higher than each summed over the sweep: **{claim}** (lowest ratio "
            f"{_num(v.min_ratio, '.3f')}; goodput summed over loads: {totals}).",
            markdown_table(["load", "gated / best of never, always"], rows),
        ]
    )


def _thresholds(values: list[int | None]) -> str:
    """null is no threshold: speculation always on."""
    return " -> ".join("none" if t is None else str(t) for t in values) or "-"


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60)}:{seconds % 60:04.1f}"


def _trace_section(t: TraceReplay) -> str:
    text = [
        "## Trace replay",
        f"{describe_replay(t)}. Open loop: every request is sent at its trace time / "
        f"{t.speed:g} whatever is in flight. SLO: TTFT <= {t.slo.ttft_ms} ms and TPOT <= "
        f"{t.slo.tpot_ms} ms. Windows of {t.window_s:g} s of trace time "
        f"({t.window_s / t.speed:g} s of replay); a request counts in the window it was due "
        "in; the running batch is the target's own mean per decode iteration; thresholds "
        "are read at each window's start and end (none: always speculate).",
    ]
    totals = [
        [
            v.policy + ("" if v.policy != "gated" else f" ({v.threshold})"),
            f"{v.goodput_rps:.3f}",
            f"{v.output_tokens_per_s:.0f}",
            _lat(v.ttft_ms),
            _lat(v.tpot_ms),
            _num(v.acceptance),
            _num(v.mean_batch, ".1f"),
            f"{v.ok}/{v.requests}",
            f"{run.max_late_ms:.1f}",
        ]
        for run in t.runs
        for v in [run.total]
    ]
    header = ["policy", "goodput req/s", "tok/s", "TTFT p50/p99 ms", "TPOT p50/p99 ms"]
    header += ["acceptance", "mean batch", "ok/sent", "latest send ms late"]
    text.append(markdown_table(header, totals))
    for run in t.runs:
        rows = [
            [
                _clock(w.start_s),
                str(w.arrivals),
                f"{w.arrivals / w.seconds:.2f}",
                _num(w.mean_batch, ".1f"),
                _thresholds(w.thresholds),
                f"{w.goodput_rps:.3f}",
                _lat(w.ttft_ms),
                _lat(w.tpot_ms),
                f"{w.ok}/{w.arrivals}",
            ]
            for w in run.windows
        ]
        header = ["trace time", "arrivals", "req/s", "mean batch", "threshold"]
        header += ["goodput req/s", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "ok/sent"]
        text += [f"### {run.total.policy}, per window", markdown_table(header, rows)]
    return "\n\n".join(text)


# --- plots ---------------------------------------------------------------------------


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_speedup(r: BenchResult, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    assert r.batch_sweep is not None
    series = [("batch sweep", r.batch_sweep.points, r.batch_sweep.crossover, "o-")]
    if r.load_sweep and r.load_sweep.points:
        series.append(("load sweep", r.load_sweep.points, r.load_sweep.crossover, "s--"))
    for row, (label, points, crossover, style) in enumerate(series):
        line = ax.plot([p.batch for p in points], [p.speedup for p in points], style, label=label)
        if crossover.status == "crosses" and crossover.batch is not None:
            ax.axvline(crossover.batch, color=line[0].get_color(), linestyle=":", alpha=0.8)
            ax.annotate(
                f"crossover {crossover.batch:.1f}\nthreshold {crossover.threshold}",
                (crossover.batch, 1.0),
                textcoords="offset points",
                xytext=(6, 10 + 28 * row),  # one label per series, stacked
                fontsize=8,
            )
    ax.axhline(1.0, color="grey", linewidth=1)
    _batch_axis(ax, sorted({p.batch for _, points, _, _ in series for p in points}))
    ax.set_xlabel("running batch size")
    ax.set_ylabel("speedup (spec / plain tokens per second)")
    ax.set_title(f"{r.target.model} + {r.target.draft or r.target.method}, k = {r.target.k}")
    ax.legend()
    return save_figure(fig, path)


def plot_goodput(s: LoadSweep, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for policy in POLICY_ORDER:
        levels = sorted((v for v in s.levels if v.policy == policy), key=lambda v: v.load)
        if levels:
            label = policy if policy != "gated" else f"gated at {s.gated_threshold}"
            ax.plot([v.load for v in levels], [v.goodput_rps for v in levels], "o-", label=label)
    if s.kind == "closed":
        _batch_axis(ax, sorted({v.load for v in s.levels}))
    ax.set_xlabel("concurrent clients" if s.kind == "closed" else "offered load (requests/s)")
    ax.set_ylabel("goodput (requests/s within SLO)")
    ax.set_title(f"SLO: TTFT <= {s.slo.ttft_ms} ms, TPOT <= {s.slo.tpot_ms} ms")
    ax.legend()
    return save_figure(fig, path)


def _batch_axis(ax, ticks: list[float]) -> None:
    """Log-2 axis labelled with the measured values themselves (1, 2, 4, 6, ...)."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()


def save_figure(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    fig.clf()
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def plot_trace(t: TraceReplay, path: Path) -> Path:
    """Over trace time: the offered rate, the running batch with the threshold, goodput
    and TPOT p99, one line per policy."""
    plt = pyplot()
    fig, axes = plt.subplots(4, 1, figsize=(8, 9), sharex=True)
    rate, batch, goodput, tpot = axes
    first = t.runs[0].windows
    starts = [w.start_s / 60 for w in first]
    width = t.window_s / 60
    rate.bar(starts, [w.arrivals / w.seconds for w in first], width=width, align="edge")
    rate.set_ylabel("arrivals (req/s)")
    for run in t.runs:
        mid = [(w.start_s + t.window_s / 2) / 60 for w in run.windows]
        label = run.total.policy
        line = batch.plot(mid, [w.mean_batch for w in run.windows], "o-", label=label)
        limits = [
            (m, w.thresholds[-1])
            for m, w in zip(mid, run.windows, strict=True)
            if w.thresholds and w.thresholds[-1] is not None
        ]
        if limits:
            batch.step(*zip(*limits, strict=True), ":", where="mid", color=line[0].get_color())
        goodput.plot(mid, [w.goodput_rps for w in run.windows], "o-", label=label)
        tpot.plot(mid, [w.tpot_ms.p99 for w in run.windows], "o-", label=label)
    batch.set_ylabel("running batch\n(dotted: threshold)")
    goodput.set_ylabel("goodput (req/s)")
    tpot.set_ylabel("TPOT p99 (ms)")
    tpot.axhline(t.slo.tpot_ms, color="grey", linewidth=1)
    tpot.set_xlabel("trace time (min)")
    batch.legend()
    rate.set_title(f"trace {t.source} at {t.speed:g}x, lengths x{t.scale:g}")
    return save_figure(fig, path)
