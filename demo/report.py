"""The demo's report: demo.md (what the demo showed, its phases, the operator's Events, each
policy's throughput on each phase's batches and the verdict), demo.json (the timeline itself,
so the report can be rebuilt and checked) and two pictures: the threshold following the
crossover, and goodput per phase and policy. Every simulated number says so: a simulated GPU's
clock is not a GPU."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from spectune.demo.timeline import (
    ROLLED_BACK,
    TRIGGERED,
    Counterfactual,
    PhaseResult,
    Timeline,
)
from spectune.demo.verdict import Verdict, against_better_fixed, verdict
from spectune.demo.view import (
    clock,
    seconds_text,
    short_label,
    short_sku,
    threshold_text,
)
from spectune.engine.bench.report import markdown_table, pyplot, save_figure
from spectune.operator.estimator import MIN_STEPS

TOP = 1.25  # a None threshold (always speculate) is drawn this far above the largest value
SKU_COLORS = ("C0", "C1", "C2", "C4", "C5", "C6")  # C3 (red) marks the calibrations


def write_report(
    timeline: Timeline, out: Path, min_changes: int = 3, tolerance: float = 0.03
) -> list[Path]:
    """Write demo.md, demo.json, threshold.png and goodput.png into `out`; returns the paths in
    that order. `min_changes` and `tolerance` are the verdict's (a shorter demo expects fewer
    changes): pass the ones the driver judges the run by, so the report says the same."""
    out.mkdir(parents=True, exist_ok=True)
    md, data = out / "demo.md", out / "demo.json"
    data.write_text(timeline.model_dump_json(indent=2) + "\n")
    threshold = plot_threshold(timeline, out / "threshold.png")
    goodput = plot_goodput(timeline, out / "goodput.png")
    result = verdict(timeline, min_changes, tolerance)
    md.write_text(markdown(timeline, result, threshold.name, goodput.name))
    return [md, data, threshold, goodput]


def skus(timeline: Timeline) -> list[str]:
    """The short names of every SKU the demo ran on, in order of first appearance."""
    seen = [p.sku for p in timeline.phases] + [k for s in timeline.samples for k in s.batch]
    return list(dict.fromkeys(short_sku(s) for s in seen))


def clock_label(timeline: Timeline) -> str:
    """ "simulated A100, H100 clock, 20x slower": said beside every number a simulated GPU
    produced, so nobody takes it for a measurement of the GPU itself."""
    names = ", ".join(skus(timeline)) or "GPU"
    if timeline.simulated:
        return f"simulated {names} clock, {timeline.time_scale:g}x slower"
    return f"{names}, real time"


# --- markdown ------------------------------------------------------------------------


def markdown(
    timeline: Timeline,
    v: Verdict,
    threshold_png: str = "threshold.png",
    goodput_png: str = "goodput.png",
) -> str:
    """The report a person reads; the pictures are linked by their names beside it."""
    parts = [
        "# spectune demo",
        _summary(timeline, v),
        f"![the threshold following the crossover]({threshold_png})",
        f"![goodput per phase and policy]({goodput_png})",
        "## Phases",
        _phase_table(timeline),
        "## The operator's Events",
        _marks_table(timeline),
        "## Each policy on each phase's batches",
        _counterfactual_section(timeline),
        "## Verdict",
        "\n".join(("  - " if line.startswith(" ") else "- ") + line.strip() for line in v.lines()),
        "## Set-up",
        _steps_section(timeline),
    ]
    return "\n\n".join(parts) + "\n"


def _summary(timeline: Timeline, v: Verdict) -> str:
    triggers = sum(m.reason == TRIGGERED for m in timeline.marks)
    titles = ", ".join(p.name for p in timeline.phases) or "none"
    text = (
        f"Over {len(timeline.phases)} phases ({titles}) the operator re-measured the crossover "
        f"{triggers} times and changed the threshold {len(v.changes)} times"
    )
    if v.checks:
        low, high = min(c.ratio for c in v.checks), max(c.ratio for c in v.checks)
        span = f"{low:.2f}x" if low == high else f"{low:.2f}x to {high:.2f}x"
        text += (
            f"; where the batch reached the crossover its threshold served {span} the decode "
            "throughput of the better fixed policy at the phase's batches"
        )
    text += f". Verdict: **{'passed' if v.ok else 'FAILED'}**."
    when = f"Started {timeline.started_at}."
    if timeline.simulated:
        when += (
            f" Every GPU number below (batch, crossover, goodput) is from a "
            f"**{clock_label(timeline)}** than the GPU it models, not from a GPU."
        )
    return f"{text}\n\n{when}"


def _phase_table(timeline: Timeline) -> str:
    sim = " (simulated)" if timeline.simulated else ""
    header = ["phase", "SKU", "replicas", "clients", "mean / peak batch", "crossover"]
    header += ["threshold at end", "steps overrun"]
    header.append(f"live goodput req/s{sim}")
    rows = [
        [
            _phase_name(p),
            short_sku(p.sku),
            str(p.replicas),
            "/".join(map(str, p.clients)),
            f"{p.mean_batch:.1f} / {p.peak_batch:.1f}" + (" *" if p.crosses else ""),
            _crossover(p),
            threshold_text(p.threshold),
            f"{p.overrun_percent:.0f}%",
            f"{p.goodput_rps:.2f} ({p.goodput_rps / max(p.replicas, 1):.2f} per engine)",
        ]
        for p in timeline.phases
    ]
    note = (
        "\\* the batch reached the crossover (or, where only a bound was measured, the "
        "threshold): the threshold matters here. Clients take turns "
        "at each level; the batch is per engine, its mean over the phase and the highest "
        "tick's; the threshold is the one in force at its end (always: no "
        "threshold, speculate at every batch; never (0): never speculate). Steps overrun: "
        "iterations that took longer on this CPU than on the modelled GPU (its clock slowed "
        "as the engines run it), per 100 decode steps (prefills count too, so it can pass "
        "100%); where it is high, wall-clock goodput measures this CPU as much as the GPU, "
        "while the operator's crossover, from the engines' modelled step times, does not."
    )
    return markdown_table(header, rows) + "\n\n" + note


def _crossover(p: PhaseResult) -> str:
    value = "not crossed" if p.crossover is None else f"{p.crossover:.1f}"
    return value + (f" ({_cell(p.crossover_reason)})" if p.crossover_reason else "")


def _phase_name(p: PhaseResult) -> str:
    """The title as the live view said it, led by the name when it does not begin with it."""
    title = _cell(p.title)
    if title.startswith(p.name):
        return title
    return p.name + (f": {title}" if title else "")


def _marks_table(timeline: Timeline) -> str:
    if not timeline.marks:
        return "The operator made none of the Events the demo follows."
    rows = [
        [clock(m.t), m.phase, m.reason, _cell(m.message)]
        for m in sorted(timeline.marks, key=lambda m: m.t)
    ]
    return markdown_table(["t", "phase", "reason", "message"], rows)


def _counterfactual_section(timeline: Timeline) -> str:
    compared = [p for p in timeline.phases if p.counterfactual is not None]
    if not compared:
        return "No phase ran a batch bucket in both modes, so no policy could be compared."
    sim = " (simulated)" if timeline.simulated else ""
    header = ["phase", "SKU", "batches (share of decode time)", "decode time compared"]
    header += [f"auto (threshold){sim}", "never", "always", "auto ÷ better fixed"]
    rows = []
    for p in compared:
        c = p.counterfactual
        assert c is not None
        ratio, better = against_better_fixed(c)
        tps = c.gpu_tokens_per_s
        rows.append(
            [
                p.name + (" *" if p.crosses else ""),
                short_sku(p.sku),
                _batches(c),
                f"{100 * c.compared:.0f}%",
                f"{tps['auto']:.0f} ({threshold_text(c.threshold)})",
                f"{tps['never']:.0f}",
                f"{tps['always']:.0f}",
                f"{ratio:.2f}x ({better})",
            ]
        )
    intro = (
        "Each policy's decode tokens per second per engine on the phase's traffic, on the GPU's "
        "clock: per batch bucket, each mode's throughput as the phase's engines measured it "
        "(their exploration interleaves the two modes at the same batch sizes), weighted by "
        "the bucket's share of their decode time, over the buckets measured in both modes "
        f"(at least {MIN_STEPS} steps each; the share of decode time they hold is shown). Auto "
        "runs the operator's threshold at the phase's end: it speculates in the buckets whose "
        "batch is below it. Every policy meets the same batches: replaying the traffic under "
        "each policy in turn on this CPU did not make the same batches (docs/PERFORMANCE.md). "
        "\\* the batch reached the crossover (or the threshold, where only a bound was "
        "measured) at the phase's busiest: only these phases are checked."
    )
    return intro + "\n\n" + markdown_table(header, rows)


def _batches(c: Counterfactual, least: float = 0.05) -> str:
    """The batches that held at least `least` of the compared decode time, with their shares."""
    held = [b for b in c.batches if b.share >= least]
    return ", ".join(f"{b.batch} ({100 * b.share:.0f}%)" for b in held) or "-"


def _steps_section(timeline: Timeline) -> str:
    total = f"Total time: {seconds_text(timeline.total_seconds)}."
    if not timeline.cold_steps:
        return total
    rows = [[s.name, seconds_text(s.seconds)] for s in timeline.cold_steps]
    return markdown_table(["step", "time"], rows) + "\n\n" + total


def _cell(text: str) -> str:
    """Text inside a markdown table cell: a '|' would end the cell."""
    return text.replace("|", "\\|").replace("\n", " ")


# --- plots ---------------------------------------------------------------------------


def plot_threshold(timeline: Timeline, path: Path) -> Path:
    """Over the demo's seconds: the threshold (a step), each SKU's measured crossover and mean
    running batch, the phases, and every calibration's start with its trigger, so a person sees
    the threshold follow the crossover and why it moved."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(11, 5.8))
    samples = timeline.samples
    names = sorted({k for s in samples for k in (*s.batch, *s.crossover)})
    colors = dict(zip(names, SKU_COLORS * len(names), strict=False))
    finite = [s.threshold for s in samples if s.threshold is not None]
    finite += [v for s in samples for v in (*s.batch.values(), *s.crossover.values()) if v]
    top = max(finite, default=0) * TOP or 1.0

    for i, p in enumerate(timeline.phases):
        ax.axvspan(p.started, p.ended, color="0.92" if i % 2 == 0 else "0.84", zorder=0)
        ax.text(
            (p.started + p.ended) / 2,
            0.99,
            textwrap.fill(p.title, 20),
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="top",
            fontsize=8,
        )
    for sku in names:
        points = [(s.t, s.batch[sku]) for s in samples if sku in s.batch]
        if points:
            ax.plot(
                *zip(*points, strict=True),
                lw=0.8,
                alpha=0.8,
                color=colors[sku],
                label=f"mean running batch {short_sku(sku)}",
            )
        points = [(s.t, v) for s in samples if (v := s.crossover.get(sku)) is not None]
        if points:
            ts, vs = zip(*points, strict=True)
            ax.step(
                ts,
                vs,
                "--",
                where="pre",
                lw=1.6,
                color=colors[sku],
                zorder=3,
                label=f"measured crossover {short_sku(sku)} (dot: a new measurement)",
            )
            news = [(t, v) for i, (t, v) in enumerate(points) if i == 0 or v != vs[i - 1]]
            ax.plot(*zip(*news, strict=True), "o", ms=5, color=colors[sku], zorder=3)
    if samples:
        always = any(s.threshold is None for s in samples)
        label = "threshold (speculate while batch < it)"
        if always:
            label += f"\nat the top ({top:.0f}): none, always speculate"
        ys = [top if s.threshold is None else s.threshold for s in samples]
        ax.step([s.t for s in samples], ys, where="pre", lw=2.2, color="black", label=label)
        backs = [m.t for m in timeline.marks if m.reason == ROLLED_BACK]
        # each at the threshold the next sample read: the one it went back to
        at = [
            next((y for s, y in zip(samples, ys, strict=True) if s.t >= t), ys[-1]) for t in backs
        ]
        if backs:
            ax.plot(backs, at, "X", ms=9, color="C3", zorder=4, label="rolled back (goodput fell)")
    triggers = [m for m in timeline.marks if m.reason == TRIGGERED]
    for i, m in enumerate(triggers):
        ax.axvline(
            m.t,
            ls="--",
            lw=0.9,
            color="C3",
            label="calibration started (its trigger beside it)" if i == 0 else None,
        )
        ax.text(
            m.t,
            0.02,
            " " + short_label(m.message),
            transform=ax.get_xaxis_transform(),
            rotation=90,
            ha="right",
            va="bottom",
            fontsize=7,
            color="C3",
        )
    if not samples:
        ax.text(0.5, 0.5, "no samples", transform=ax.transAxes, ha="center")
    ax.set_ylim(0, top * 1.3)  # room above the top line for the phases' titles
    ax.set_xlabel("seconds since the first phase began")
    ax.set_ylabel("running batch size")
    ax.set_title(f"The threshold following the measured crossover ({clock_label(timeline)})")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.11), ncol=3, fontsize=8)
    return save_figure(fig, path)


# Each policy's bar in the policies' panel.
POLICIES = (("auto", "C2"), ("never", "C7"), ("always", "C1"))


def plot_goodput(timeline: Timeline, path: Path) -> Path:
    """Per engine and phase: the live fleet's goodput (wall clock) and, beside it, each
    policy's decode throughput on the phase's batches (the GPU's clock), what the verdict
    compares; phases whose batch reaches the crossover are hatched and starred, the only ones
    where the threshold can win or lose."""
    plt = pyplot()
    phases = timeline.phases
    fig, (live, policies) = plt.subplots(1, 2, figsize=(max(10.0, 2.8 * len(phases) + 2), 4.8))
    hatches = ["//" if p.crosses else "" for p in phases]
    bars = live.bar(
        range(len(phases)),
        [p.goodput_rps / max(p.replicas, 1) for p in phases],
        0.5,
        color="C0",
        label="live, per engine",
        edgecolor="white",
    )
    _finish_bars(live, bars, hatches, "%.2f")
    width = 0.8 / len(POLICIES)
    shown = [(i, p.counterfactual) for i, p in enumerate(phases) if p.counterfactual is not None]
    for b, (name, color) in enumerate(POLICIES if shown else ()):
        bars = policies.bar(
            [i + (b - (len(POLICIES) - 1) / 2) * width for i, _ in shown],
            [c.gpu_tokens_per_s[name] for _, c in shown],
            width,
            color=color,
            label=name,
            edgecolor="white",
        )
        _finish_bars(policies, bars, [hatches[i] for i, _ in shown], "%.0f")
    ticks = [
        f"{textwrap.fill(p.title, 18)}{' *' if p.crosses else ''}\n"
        f"{short_sku(p.sku)}, {p.replicas} pod{'s' if p.replicas != 1 else ''}"
        for p in phases
    ]
    panels = (
        (live, "goodput per engine (SLO-met req/s, wall clock)"),
        (policies, "decode tokens/s per engine (GPU clock)"),
    )
    for ax, ylabel in panels:
        ax.set_xticks(range(len(phases)), ticks, fontsize=8)
        if not phases:
            ax.text(0.5, 0.5, "no phases", transform=ax.transAxes, ha="center")
        ax.set_ylabel(ylabel)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        ax.margins(y=0.12)
    fig.suptitle(
        f"Goodput per phase, and each policy on its batches ({clock_label(timeline)})\n"
        "* hatched: the batch reached the crossover (or the threshold, for a bound)",
        fontsize=10,
    )
    return save_figure(fig, path)


def _finish_bars(ax: Any, bars: Any, hatches: list[str], fmt: str) -> None:
    for bar, hatch in zip(bars, hatches, strict=True):
        bar.set_hatch(hatch)
    ax.bar_label(bars, fmt=fmt, fontsize=7, padding=1)
