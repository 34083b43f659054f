"""Auto against fixed policies on an hour of real traffic (issue 16, "Must show" 2; recorded in
docs/PERFORMANCE.md).

On the running local cluster (`make cluster-up`), one engine pod on a simulated A100 (n-gram
lookup, k=16, as in autotune_goodput.py) serves the Azure conversation trace shipped with the
bench, replayed whole, open loop, compressed `--trace-speed` times, lengths x `--trace-scale`,
every request sampled at `--temperature` (a trace records no sampling settings). The trace is a
whole service's traffic; one engine serves every `--share`-th request of it, one replica's
share under round-robin balancing, so that the simulated A100 runs near its capacity, its
batch swinging across the crossover with the trace's rate:

1. warm-up: the trace's start, replayed again and again until the operator has calibrated the
   new Auto SpecDeployment (its Initial calibration; not counted);
2. Auto: the whole trace with the operator live (default damping), its threshold sampled at
   every window boundary;
3. a short sweep of fixed thresholds on the trace's busiest `--sweep-seconds` (of replay), the
   deployment pinned (Manual) so that the operator stops pushing;
4. never, always and the sweep's best threshold, each over the whole trace.

Goodput is SLO-met requests per second (by default a modelled 2 s to the first token and 100 ms
per token: conversation traffic is prefill-heavy, and 40 ms per token, autotune_goodput.py's,
fails most requests under every policy), per window of trace time and over the whole replay.
Simulated clock: the numbers are the device model's A100, slowed `--time-scale` times; the
engine's overruns (iterations the CPU ran past that clock) are printed beside them.

Usage: .venv/bin/python benchmarks/trace_goodput.py [--trace-speed 8] [--trace-scale 0.1]
       [--sweep 24,36,48,60,72] [--calibration-window-s 40] [--out .cache/trace-goodput]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from autotune_goodput import (
    REPO,
    Setup,
    cluster_env,
    numbers,
    read_overruns,
    specdeployment,
    wait,
)

from spectune.engine.bench.loadgen import Bounds
from spectune.engine.bench.report import markdown_table, plot_trace
from spectune.engine.bench.schema import Slo, TraceReplay, TraceRun
from spectune.engine.bench.targets import HttpTarget
from spectune.engine.bench.trace import (
    TraceSettings,
    fit,
    prompt_text,
    replay,
    replay_policies,
    slice_of,
)
from spectune.engine.bench.trace_file import Trace, load_trace

REQUEST_TIMEOUT_S = 300.0


def slo(args: argparse.Namespace) -> Slo:
    """The modelled targets on the slowed wall clock."""
    scale = args.time_scale
    return Slo(ttft_ms=round(args.ttft_ms * scale), tpot_ms=round(args.tpot_ms * scale))


async def warm_up(target: HttpTarget, setup: Setup, settings: TraceSettings, args: Any) -> dict:
    """The trace's first `--warmup-seconds`, over and over, until Calibrated; the status."""
    if target.max_model_len is None:
        sys.exit(f"trace_goodput: {target.url}/v1/models reports no max_model_len")
    requests = fit(settings.trace, settings.scale, target.max_model_len)
    part = slice_of(requests, settings.speed, Bounds(10**6, args.warmup_seconds, REQUEST_TIMEOUT_S))
    prompts = [prompt_text(r.prompt_tokens, i) for i, r in enumerate(part.requests)]
    started = time.monotonic()
    while time.monotonic() - started < 1200:
        await replay(target, part, prompts, settings.speed, 1, REQUEST_TIMEOUT_S,
                     temperature=args.temperature)  # fmt: skip
        if (await asyncio.to_thread(setup.condition, "Calibrated")).get("status") == "True":
            return await asyncio.to_thread(setup.status)
        print(f"  warming up: {time.monotonic() - started:.0f} s, not calibrated yet", flush=True)
    sys.exit("trace_goodput: no calibration within 1200 s of warm-up (see the operator's log)")


async def replay_under(
    target: HttpTarget,
    settings: TraceSettings,
    policies: list[tuple[str, int | None]],
    seconds: float,
    args: argparse.Namespace,
) -> TraceReplay:
    bounds = Bounds(len(settings.trace.requests), seconds, REQUEST_TIMEOUT_S)
    return await replay_policies(
        target,
        settings,
        policies,
        bounds,
        slo(args),
        print,
        lambda _r: None,
        args.temperature,
    )


def busiest(trace: Trace, span_s: float) -> Trace:
    """The `span_s` seconds of trace time with the most arrivals, starting at 0: a sweep on
    the trace's quiet start would find every threshold alike."""
    times = [r.offset_s for r in trace.requests]
    first, count, end = 0, 0, 0
    for i, t in enumerate(times):
        while end < len(times) and times[end] < t + span_s:
            end += 1
        if end - i > count:
            first, count = i, end - i
    t0 = times[first]
    picked = trace.requests[first : first + count]
    return Trace(
        f"{trace.source}, its busiest {span_s:g} s from {t0:.0f} s",
        tuple(dataclasses.replace(r, offset_s=r.offset_s - t0) for r in picked),
    )


def best_fixed(sweep: TraceReplay) -> int:
    best = max(sweep.runs, key=lambda r: (r.total.goodput_rps, r.total.output_tokens_per_s))
    assert best.total.threshold is not None
    return best.total.threshold


def label(run: TraceRun) -> str:
    t = run.total
    return {"current": "auto", "never": "never", "always": "always"}.get(t.policy, str(t.threshold))


def window_table(t: TraceReplay, crossover: float | None) -> list[str]:
    """Per window: arrivals, Auto's batch and thresholds, every policy's goodput and Auto
    against the best fixed one; `*` marks windows whose batch (never speculating) reached
    the crossover Auto measured in its warm-up."""
    auto, *fixed = t.runs
    never = next(r for r in fixed if r.total.policy == "never")
    header = ["trace min", "arrivals", "batch (never)", "auto thresholds"]
    header += [f"goodput {label(r)}" for r in t.runs] + ["auto / best fixed"]
    rows = []
    for w, a in enumerate(auto.windows):
        others = [r.windows[w].goodput_rps for r in fixed]
        batch = never.windows[w].mean_batch
        crossed = crossover is not None and batch is not None and batch >= crossover
        rows.append(
            [f"{a.start_s / 60:.0f}{' *' if crossed else ''}", str(a.arrivals),
             "-" if batch is None else f"{batch:.1f}",
             ",".join("always" if x is None else str(x) for x in a.thresholds)]
            + [f"{r.windows[w].goodput_rps:.2f}" for r in t.runs]
            + [f"{a.goodput_rps / max(others):.3f}" if max(others) else "-"]
        )  # fmt: skip
    totals = [r.total.goodput_rps for r in fixed]
    rows.append(
        ["all", str(auto.total.requests),
         "-" if never.total.mean_batch is None else f"{never.total.mean_batch:.1f}", ""]
        + [f"{r.total.goodput_rps:.2f}" for r in t.runs]
        + [f"{auto.total.goodput_rps / max(totals):.3f}"]
    )  # fmt: skip
    return markdown_table(header, rows).splitlines()


async def main_async(args: argparse.Namespace, setup: Setup) -> None:
    whole = load_trace(args.trace)
    share = Trace(f"{whole.source} (1 in {args.share})", whole.requests[:: args.share])
    settings = TraceSettings(
        share, speed=args.trace_speed, scale=args.trace_scale, windows=args.windows
    )
    url = wait("the engine pod ready", setup.pod_url, 180)
    seconds = args.duration_s or settings.trace.requests[-1].offset_s / settings.speed + 1
    async with HttpTarget(url, None, setup.token(), REQUEST_TIMEOUT_S) as target:
        print(f"engine at {url}; warming up on the trace until the operator calibrates",
              flush=True)  # fmt: skip
        status = await warm_up(target, setup, settings, args)
        (a100,) = status["perSku"]
        print(f"calibrated: threshold {status['threshold']['current']} ({a100['reason']})")
        overruns = await asyncio.to_thread(read_overruns, url)
        earlier = len(await asyncio.to_thread(setup.event_reasons))
        auto = await replay_under(target, settings, [("current", None)], seconds, args)
        reasons = (await asyncio.to_thread(setup.event_reasons))[earlier:]
        setup.pin(status["threshold"]["current"])
        busy = dataclasses.replace(
            settings, trace=busiest(share, args.sweep_seconds * settings.speed)
        )
        sweep = await replay_under(
            target, busy, [("gated", t) for t in args.sweep], args.sweep_seconds, args
        )
        best = best_fixed(sweep)
        print(f"the sweep's best fixed threshold: {best}", flush=True)
        fixed = await replay_under(
            target, settings, [("never", 0), ("always", None), ("gated", best)], seconds, args
        )
        overruns = await asyncio.to_thread(read_overruns, url) - overruns
    both = auto.model_copy(update={"runs": auto.runs + fixed.runs})
    table = window_table(both, a100.get("batchSize"))
    sweep_line = ", ".join(f"{label(r)}: {r.total.goodput_rps:.2f}" for r in sweep.runs)
    lines = [
        f"trace {both.source}: {both.requests} requests, {both.trace_seconds / 60:.0f} min "
        f"at {both.speed:g}x ({seconds / 60:.1f} min each), lengths x{both.scale:g}, "
        f"temperature {args.temperature:g}; simulated A100 at {args.time_scale:g}x; "
        f"SLO {both.slo.ttft_ms} ms TTFT, {both.slo.tpot_ms} ms TPOT (wall clock); "
        f"{overruns:.0f} iterations overran the modelled clock; calibration windows of "
        f"{args.calibration_window_s or round(30 * args.time_scale)} s (wall)",
        f"warm-up calibration: {a100['reason']}; Events during Auto's replay: {reasons}",
        f"sweep over {sweep.source} (goodput req/s): {sweep_line}",
        "",
        *table,
    ]
    print("\n" + "\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "trace-goodput.md").write_text("\n".join(lines) + "\n")
    (args.out / "trace-goodput.json").write_text(
        json.dumps(
            {"replay": both.model_dump(), "sweep": sweep.model_dump(), "warm_up": status,
             "events": reasons, "overruns": overruns},
            indent=2,
        )
    )  # fmt: skip
    plot_trace(both, args.out / "trace-goodput.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default="azure-conv")
    parser.add_argument("--trace-speed", type=float, default=6.0, help="trace s per wall s")
    parser.add_argument("--trace-scale", type=float, default=0.1, help="factor on lengths")
    parser.add_argument("--share", type=int, default=6, help="replay every N-th request")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--time-scale", type=float, default=8.0, help="the pod's slowdown")
    parser.add_argument("--ttft-ms", type=float, default=2000, help="modelled SLO")
    parser.add_argument("--tpot-ms", type=float, default=100, help="modelled SLO")
    parser.add_argument("--windows", type=int, default=12)
    parser.add_argument("--calibration-window-s", type=int, help="wall s (default: 30 modelled s)")
    parser.add_argument(
        "--duration-s", type=float, help="of each replay (default: the whole trace)"
    )
    parser.add_argument("--warmup-seconds", type=float, default=60.0)
    parser.add_argument("--sweep", type=numbers, default=[24, 36, 48, 60, 72])
    parser.add_argument("--sweep-seconds", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=REPO / ".cache" / "trace-goodput")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    body = specdeployment(
        "bench", args.time_scale, True, slo(args), window_s=args.calibration_window_s
    )
    setup = Setup(cluster_env(), args.out / "operator.log", body)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` cleans up
    try:
        asyncio.run(main_async(args, setup))
    finally:
        setup.close()


if __name__ == "__main__":
    main()
