"""How faithful the fleet simulator's engine pod (sim/engine_pod.py) is to an engine served on
the local cluster, under the same closed-loop load (issue 32): sim_fidelity.py's `--clients`
comparison, with the real side an engine pod answering HTTP instead of an in-process engine.

On the running local cluster (`make cluster-up`): one SpecDeployment, one replica on a node of
the simulated SKU (`spectune.io/simulate-gpu`, its clock slowed `--time-scale` times and held
to the wall clock: hack/pod_runner.py), the tiny target with the tiny draft (k=4), the
threshold pinned (Manual) to the gate under test: always speculate (4096, past any batch the
engine runs; the CRD pins a number) and never (0), exploration 0. `--clients` closed-loop
clients (sim_fidelity's `Clients`: each sends its next request an exponential think time after
its last finished, seeded) stream completions over HTTP to the pod's loopback address: the
prompts and output lengths of sim_fidelity's `workload()` (the prompts as text the byte
tokenizer turns back into the same tokens), `max_tokens` the output length and `ignore_eos`,
so that every answer has exactly that length. Every time is in the SKU's modelled seconds:
the client's wall clock divided by the time scale (think times and the SLO multiplied by it).

The pod's /metrics, scraped from its loopback address before the first request, when the
last one is sent and after the last answer, give the decode steps per (mode, batch bucket)
while the clients kept sending (the running-batch distribution; its mean exactly, as the
decode steps' output tokens less the accepted drafted ones, per step), the accepted / drafted
tokens over the run (SimEngine's acceptance, pooled: /metrics has no per-request counts,
converted as sim_fidelity's `--acceptance`), the engine's own SLO-met count and latencies, and
the overruns: iterations this CPU ran past the modelled clock, where the comparison is not
faithful.

SimEngine then runs the same requests under the same closed loop (sim_fidelity's `run_sim`:
same jobs, think times, acceptance, SKU, k, max batch size), and the comparison prints as
sim_fidelity's closed-loop lines: the mean running batch, the distributions' distance and the
goodput under `--slo` (SLO-met requests per modelled second while the clients kept sending),
the real side's timed by the clients: HTTP, the server and tokenisation included, which the
simulator does not model. Beside them, the mean TTFT and end-to-end latency of the clients, the
simulator and the engine itself: the engine times a request on its modelled clock from when it
joined, between iterations, so it leaves out HTTP and tokenisation, and also the wait for the
iteration running when the request arrived, which the clients and the simulator both count.

Usage: .venv/bin/python benchmarks/sim_fidelity_cluster.py [--sku L4] [--time-scale 2]
           [--clients 16] [--think 2000] [--requests 192] [--seconds 300] [--slo 1000 60]
           [--gates always never] [--k 4] [--max-batch-size 32] [--acceptance matched|raw]
           [--prompt 16 96] [--output 32 96] [--seed 0] [--out .cache/sim-fidelity-cluster]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from autotune_goodput import PORT, REPO, Setup, cluster_env, wait
from prometheus_client.parser import text_string_to_metric_families
from sim_fidelity import (
    Clients,
    Job,
    Run,
    Steady,
    Tally,
    acceptances,
    compared,
    run_sim,
    shares,
    steady,
    steady_lines,
    table,
    workload,
)
from tokenizers import Tokenizer

from spectune.engine import contract as c
from spectune.engine.bench.loadgen import Counters, RequestResult, run_request
from spectune.engine.bench.targets import HttpTarget, parse_counters
from spectune.engine.bench.workload import RequestSpec
from spectune.engine.config import EngineConfig
from spectune.engine.device_time import sku_named
from spectune.engine.gate import GateSettings
from spectune.engine.request_timing import RequestTiming
from spectune.engine.zoo.registry import resolve_model
from spectune.operator.models import GROUP, VERSION

NAME = "sim-fidelity"
ALWAYS = 4096  # the largest threshold the CRD takes: the engine speculates at every batch
GATES = {"always": ALWAYS, "never": 0}
TITLES = {"always": f"always speculate (threshold {ALWAYS})", "never": "plain only (threshold 0)"}
PROGRESS_S = 10.0  # wall seconds between progress lines
WITHIN = 0.10  # the bound


def specdeployment(args: argparse.Namespace, threshold: int) -> dict[str, Any]:
    """One engine pod on the simulated SKU, the threshold pinned, nothing explored; its SLO
    the benchmark's on the slowed clock, so that the engine's own SLO-met count is comparable."""
    scale = args.time_scale
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SpecDeployment",
        "metadata": {"name": NAME},
        "spec": {
            "replicas": 1,
            "model": {"name": "tiny-target"},
            "engine": {
                "gpus": 1,
                "maxBatchSize": args.max_batch_size,
                "port": PORT,
                "nodeSelector": {"nvidia.com/gpu.product": sku_named(args.sku).product},
                "podAnnotations": {
                    "spectune.io/simulate-gpu": "true",
                    "spectune.io/simulate-time-scale": f"{scale:g}",
                },
            },
            "speculation": {
                "method": "draft",
                "draft": "tiny-draft",
                "numSpeculativeTokens": args.k,
                "threshold": {"mode": "Manual", "value": threshold, "min": 0, "max": ALWAYS},
            },
            "slo": {
                "ttftMilliseconds": round(args.slo[0] * scale),
                "tpotMilliseconds": round(args.slo[1] * scale),
            },
            "tuning": {"explorationPercent": 0},
        },
    }


@dataclass(frozen=True)
class Served:
    """What the pod's engine runs, as run_sim reads an engine (sim_fidelity.Configured): the
    server builds its EngineConfig from these settings and the defaults of the rest."""

    config: EngineConfig
    max_model_len: int


@dataclass(frozen=True)
class Scrape:
    """One read of the pod's /metrics."""

    counters: Counters
    slo_met: float
    draft_prefill_s: float
    catchup_s: float
    threshold: float
    exploration: float
    ttft: tuple[float, float]  # histogram (sum, count), modelled x time scale
    e2e: tuple[float, float]


def parse_scrape(text: str) -> Scrape:
    counters = parse_counters(text)
    if counters is None:
        sys.exit("sim_fidelity_cluster: the pod's /metrics has no spectune metrics")
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.labels or s.name in (c.DRAFT_PREFILL_SECONDS, c.DRAFT_CATCHUP_SECONDS):
                values[s.name] = values.get(s.name, 0.0) + s.value
    hist = {h: (values.get(f"{h}_sum", 0.0), values.get(f"{h}_count", 0.0))
            for h in (c.TIME_TO_FIRST_TOKEN, c.E2E_REQUEST_LATENCY)}  # fmt: skip
    return Scrape(
        counters,
        values.get(c.REQUESTS_SLO_MET, 0.0),
        values.get(c.DRAFT_PREFILL_SECONDS, 0.0),
        values.get(c.DRAFT_CATCHUP_SECONDS, 0.0),
        values.get(c.SPEC_THRESHOLD, float("nan")),
        values.get(c.SPEC_EXPLORATION_RATIO, float("nan")),
        hist[c.TIME_TO_FIRST_TOKEN],
        hist[c.E2E_REQUEST_LATENCY],
    )


def mean_of(after: tuple[float, float], before: tuple[float, float]) -> float:
    count = after[1] - before[1]
    return (after[0] - before[0]) / count if count else float("nan")


@dataclass
class Drive:
    """What the clients did: each request's result (by job), how many jobs the clients were
    handed (all of them unless the wall-clock limit cut the run), when the last was sent, the
    scrapes."""

    results: dict[int, RequestResult]
    handed: int
    started: float  # perf_counter at the first send
    last_sent: float  # perf_counter at the last send
    before: Scrape
    at_last_send: Scrape
    after: Scrape


async def drive(
    target: HttpTarget,
    metrics: httpx.AsyncClient,
    name: str,
    jobs: list[Job],
    args: argparse.Namespace,
) -> Drive:
    """sim_fidelity's closed loop (its `Clients`) on the wall clock, slowed as the pod's:
    `args.clients` clients, each sending its next job that job's think time after its last
    answer finished; none sent after `args.seconds` of wall time."""
    scale = args.time_scale
    sending = Clients(jobs, args.clients)
    results: dict[int, RequestResult] = {}
    tasks: set[asyncio.Task[None]] = set()
    woken = asyncio.Event()
    before = await scrape(metrics)
    t0 = time.perf_counter()

    def modelled() -> float:
        return (time.perf_counter() - t0) / scale

    async def one(i: int) -> None:
        text = bytes(jobs[i].prompt).decode()
        spec = RequestSpec(text, jobs[i].output, 0.0)
        results[i] = await run_request(target, spec, time.perf_counter, args.request_timeout)
        sending.finished(modelled())
        woken.set()

    sent, last_sent, next_line = 0, t0, t0 + PROGRESS_S
    while sent < len(jobs):
        if time.perf_counter() - t0 > args.seconds:
            print(f"  {name}: the {args.seconds:g} s limit: {sent} of {len(jobs)} sent",
                  flush=True)  # fmt: skip
            break
        for _, i in sending.due(modelled()):
            last_sent = time.perf_counter()
            tasks.add(task := asyncio.create_task(one(i)))
            task.add_done_callback(tasks.discard)
            sent += 1
        if sent == len(jobs):
            break
        if time.perf_counter() >= next_line:
            next_line += PROGRESS_S
            print(f"  {name}: {time.perf_counter() - t0:4.0f} s, {sent}/{len(jobs)} sent, "
                  f"{len(results)} answered, {len(tasks)} in flight", flush=True)  # fmt: skip
        woken.clear()
        due = sending.next_send()
        pause = PROGRESS_S if due is None else max(0.0, due * scale - (time.perf_counter() - t0))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(woken.wait(), min(pause, PROGRESS_S))
    at_last_send = await scrape(metrics)
    while tasks:
        done_before = len(results)
        await asyncio.wait(set(tasks), timeout=PROGRESS_S)
        if tasks:
            print(f"  {name}: draining, {len(results)}/{sent} answered "
                  f"(+{len(results) - done_before})", flush=True)  # fmt: skip
    handed = sending.next
    return Drive(results, handed, t0, last_sent, before, at_last_send, await scrape(metrics))


async def scrape(metrics: httpx.AsyncClient) -> Scrape:
    response = await metrics.get("/metrics")
    response.raise_for_status()
    return parse_scrape(response.text)


def real_run(jobs: list[Job], d: Drive, scale: float) -> Run:
    """The real side as sim_fidelity's Run: each answered request's timing on the modelled
    clock (the client's wall clock / time scale), the last send, the run's speculation
    counters and per (mode, bucket) tallies from /metrics. No per-step batches: those are in
    `real_steady`, from the step counters."""
    run = Run()
    whole = d.after.counters - d.before.counters
    for (mode, bucket), stats in whole.steps.items():
        run.tallies[(mode, bucket)] = Tally(stats.steps, stats.seconds / scale, stats.tokens)
    run.drafted, run.accepted = whole.drafted, whole.accepted
    run.per_request = [(0, 0)] * len(jobs)  # not exposed per request: the run's pooled
    run.draft_prefill_seconds = (d.after.draft_prefill_s - d.before.draft_prefill_s) / scale
    run.catchup_seconds = (d.after.catchup_s - d.before.catchup_s) / scale
    run.preemptions = None  # not in /metrics
    run.total_seconds = (max((r.done_at for r in d.results.values()), default=d.started)
                         - d.started) / scale  # fmt: skip
    for r in d.results.values():
        if r.ok and r.ttft is not None:
            timing = RequestTiming(r.ttft / scale, (r.done_at - r.sent_at) / scale,
                                   r.output_tokens)  # fmt: skip
            run.timings.append(((r.sent_at - d.started) / scale, timing))
    run.last_sent = (d.last_sent - d.started) / scale
    return run


def running_batch(window: Counters) -> tuple[dict[int, int], float]:
    """Decode steps per batch bucket between two scrapes, and their mean running batch,
    exactly: each sequence in a decode step commits one token and, in a spec step, the drafted
    tokens accepted for it, so the batches sum to the output tokens less the accepted ones."""
    counts: dict[int, int] = {}
    for (_, bucket), stats in window.steps.items():
        counts[bucket] = counts.get(bucket, 0) + stats.steps
    tokens = sum(s.tokens for s in window.steps.values())
    return counts, (tokens - window.accepted) / sum(counts.values())


def real_steady(run: Run, d: Drive, ttft_s: float, tpot_s: float) -> Steady:
    """The real side while the clients kept sending: the running batch from the step
    counters between the first and the last send, goodput from the clients' timings."""
    counts, mean = running_batch(d.at_last_send.counters - d.before.counters)
    return Steady(shares(counts), mean, run.met(ttft_s, tpot_s), run.last_sent, run.acceptance)


@dataclass(frozen=True)
class Outcome:
    gate: str
    batch: tuple[float, float]
    distance: float
    goodput: tuple[float, float]
    engine_goodput: float
    met: tuple[int, int]
    sent: int
    errors: int
    overruns: int
    steady_overruns: int
    iterations: int
    wall_s: float


async def one_gate(
    name: str, setup: Setup, url: str, jobs: list[Job], args: argparse.Namespace
) -> tuple[list[str], Outcome, dict[str, Any]]:
    threshold, scale = GATES[name], args.time_scale
    ttft_s, tpot_s = (v / 1e3 for v in args.slo)
    async with (
        HttpTarget(url, None, None, args.request_timeout) as target,
        httpx.AsyncClient(base_url=url, timeout=10, trust_env=False) as metrics,
    ):
        await asyncio.to_thread(setup.pin, threshold)
        print(f"{name}: threshold pinned at {threshold}; waiting for the engine to run it",
              flush=True)  # fmt: skip
        pinned = await until(metrics, threshold, 120)
        if target.max_model_len is None:
            sys.exit(f"sim_fidelity_cluster: {url}/v1/models reports no max_model_len")
        warm = [RequestSpec(bytes(j.prompt).decode(), j.output) for j in jobs[: args.clients]]
        await asyncio.gather(*(run_request(target, s, time.perf_counter, 300) for s in warm))
        load = os.getloadavg()[0]
        print(f"{name}: warmed up ({len(warm)} requests, not counted; exploration "
              f"{pinned.exploration:g}); load average {load:.2f}; {args.clients} clients, "
              f"{len(jobs)} requests", flush=True)  # fmt: skip
        d = await drive(target, metrics, name, jobs, args)
    # The jobs the clients were handed: all of them, unless the wall-clock limit stopped the
    # sending (then the simulator sends every one of these, the comparison is not like for like
    # and the line below says so).
    sent = jobs[: d.handed]
    errors = [r.error for r in d.results.values() if not r.ok]
    real = real_run(sent, d, scale)
    gate = GateSettings(threshold=threshold)
    engine_config = EngineConfig(
        model="tiny-target", draft="tiny-draft", k=args.k, gate=gate,
        max_batch_size=args.max_batch_size, simulate_device=sku_named(args.sku).product,
    )  # fmt: skip
    served = Served(engine_config, target.max_model_len)
    rates = acceptances(real, args.k, args.acceptance, pooled=True)
    print(f"{name}: {len(d.results)} answered ({len(errors)} failed) in "
          f"{time.perf_counter() - d.started:.0f} s; simulating the same closed loop ...",
          flush=True)  # fmt: skip
    sim = run_sim(sent, rates, gate, served, clients=args.clients)
    sides = real_steady(real, d, ttft_s, tpot_s), steady(sim, ttft_s, tpot_s)
    found = compared(*sides)
    steady_window = d.at_last_send.counters - d.before.counters
    whole = d.after.counters - d.before.counters
    engine_met = d.at_last_send.slo_met - d.before.slo_met
    ttft, e2e = (
        {side: sum(getattr(t, what) for _, t in run.timings) / len(run.timings)
         for side, run in (("real", real), ("sim", sim))}
        for what in ("ttft", "e2e")
    )  # fmt: skip
    ttft["engine"] = mean_of(d.after.ttft, d.before.ttft) / scale
    e2e["engine"] = mean_of(d.after.e2e, d.before.e2e) / scale
    decode = sim.tallies.items()
    sim_decode = dataclasses.replace(sim, tallies={k: v for k, v in decode if k[0] != "prefill"})
    title = f"{TITLES[name]}, {args.sku} at {scale:g}x on the local cluster"
    lines = [
        *table(f"{title}: per (mode, bucket), the whole run", real, sim_decode),
        "- real: tallies from the pod's /metrics (decode steps only; prefill steps are not "
        "observed there); modelled time: the clients' wall span / time scale",
        "",
        *steady_lines(f"{title}: {args.clients} closed-loop clients", *sides, ttft_s, tpot_s),
        f"- the engine's own SLO-met count (its modelled clock, from when a request joined) "
        f"while the clients kept sending: {engine_met:.0f}, "
        f"{engine_met / real.last_sent:.2f} req/s",
        f"- mean TTFT over the run (modelled ms): clients {ttft['real'] * 1e3:.1f}, sim "
        f"{ttft['sim'] * 1e3:.1f}, the engine's own {ttft['engine'] * 1e3:.1f}; end to end: "
        f"clients {e2e['real'] * 1e3:.1f}, sim {e2e['sim'] * 1e3:.1f}, the engine's own "
        f"{e2e['engine'] * 1e3:.1f} (the clients and the simulator time a request from its "
        "send; the engine from when it joined, between iterations, so without HTTP, "
        "tokenisation or the wait for the iteration it arrived in)",
        f"- overruns (iterations this CPU ran past the modelled clock): {whole.overruns} of "
        f"{whole.decode_steps} decode steps over the run, {steady_window.overruns} while the "
        f"clients kept sending; requests failed: {len(errors)}"
        + (f" (first: {errors[0]})" if errors else ""),
    ]
    if len(d.results) < len(jobs):
        lines.append(
            f"- CUT: the {args.seconds:g} s limit stopped the sending at {len(d.results)} of "
            f"{len(jobs)} requests; the simulator sent all {d.handed} the clients were handed: "
            "not like for like"
        )
    outcome = Outcome(
        name, found.batch, found.distance, found.goodput, engine_met / real.last_sent,
        found.met, len(d.results), len(errors), whole.overruns, steady_window.overruns,
        whole.decode_steps, time.perf_counter() - d.started,
    )  # fmt: skip
    record = {
        "outcome": dataclasses.asdict(outcome),
        "real": {"steady": dataclasses.asdict(sides[0]), "timings": [
            [at, t.ttft, t.e2e, t.output_tokens] for at, t in real.timings]},
        "sim": {"steady": dataclasses.asdict(sides[1])},
        "acceptance": {"real": real.acceptance, "rate": rates[0] if rates else None},
    }  # fmt: skip
    return lines, outcome, record


async def until(metrics: httpx.AsyncClient, threshold: int, timeout: float) -> Scrape:
    """The engine's scrape once its threshold gauge says `threshold` and it explores nothing."""
    deadline = time.monotonic() + timeout
    while True:
        now = await scrape(metrics)
        if now.threshold == threshold and now.exploration == 0:
            return now
        if time.monotonic() > deadline:
            sys.exit(f"sim_fidelity_cluster: the engine still runs threshold {now.threshold:g}, "
                     f"exploration {now.exploration:g} after {timeout:g} s")  # fmt: skip
        await asyncio.sleep(1)


def final_table(outcomes: list[Outcome], args: argparse.Namespace) -> list[str]:
    def ratio(pair: tuple[float, float]) -> str:
        if not pair[0]:
            return f"{pair[0]:.2f} -> {pair[1]:.2f}"
        x = pair[1] / pair[0]
        flag = "" if abs(x - 1) <= WITHIN else " (!)"
        return f"{pair[0]:.2f} -> {pair[1]:.2f} (x{x:.3f}){flag}"

    lines = [
        f"## Simulated over the local cluster's engine: {args.sku} at {args.time_scale:g}x, "
        f"{args.clients} clients, think {args.think:g} ms, SLO {args.slo[0]:g} ms TTFT / "
        f"{args.slo[1]:g} ms TPOT (modelled); (!): more than {WITHIN:.0%} apart",
        "",
        "| gate | requests | mean running batch, real -> sim | distance (total variation) "
        "| goodput req/s, real (clients) -> sim | engine's own goodput | overruns / decode "
        "steps | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        flag = "" if o.distance <= WITHIN else " (!)"
        lines.append(
            f"| {o.gate} | {o.sent} ({o.errors} failed) | {ratio(o.batch)} | "
            f"{o.distance:.3f}{flag} | {ratio(o.goodput)} | {o.engine_goodput:.2f} | "
            f"{o.overruns} / {o.iterations} | {o.wall_s:.0f} |"
        )
    return lines


def check_cluster() -> dict[str, str]:
    """The cluster's addresses, or one line saying to start it."""
    status = subprocess.run([str(REPO / "hack" / "cluster.sh"), "status"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    if status.returncode != 0 or not (REPO / ".local" / "cluster.env").exists():
        sys.exit("sim_fidelity_cluster: the local cluster is not up: run `make cluster-up`")
    return cluster_env()


def text_prompts(jobs: list[Job]) -> None:
    """The prompts go as text: each must turn back into its own tokens (the tiny models'
    byte-level tokenizer), or the two sides would not run the same requests."""
    tokenizer = Tokenizer.from_file(str(resolve_model("tiny-target") / "tokenizer.json"))
    for i, job in enumerate(jobs):
        try:
            same = tokenizer.encode(bytes(job.prompt).decode()).ids == job.prompt
        except UnicodeDecodeError:
            same = False
        if not same:
            sys.exit(f"sim_fidelity_cluster: prompt {i} does not round-trip as text; "
                     "try another --seed")  # fmt: skip


async def main_async(args: argparse.Namespace, setup: Setup, jobs: list[Job]) -> None:
    url = wait("the engine pod ready", setup.pod_url, 300)
    host = httpx.URL(url).host
    if not host.startswith("127."):  # pod_url returns loopback IPs only; never anything else
        sys.exit(f"sim_fidelity_cluster: {url} is not a loopback address")
    print(f"engine pod at {url}", flush=True)
    outcomes, records, report = [], {}, []
    for name in args.gates:
        lines, outcome, record = await one_gate(name, setup, url, jobs, args)
        print("\n" + "\n".join(lines) + "\n", flush=True)
        report += [*lines, ""]
        outcomes.append(outcome)
        records[name] = record
    final = final_table(outcomes, args)
    print("\n".join(final))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sim-fidelity-cluster.md").write_text("\n".join(report + final) + "\n")
    given = {k: str(v) for k, v in vars(args).items()}
    (args.out / "sim-fidelity-cluster.json").write_text(
        json.dumps({"args": given, "gates": records}, indent=2)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sku", default="L4", help="the simulated SKU (a node of it must exist)")
    parser.add_argument(
        "--time-scale", type=float, default=2.0,
        help="the pod's slowdown: modelled seconds x this = wall seconds",
    )  # fmt: skip
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument(
        "--think", type=float, default=2000.0, metavar="MS",
        help="each client's mean pause between requests (exponential, modelled ms)",
    )  # fmt: skip
    parser.add_argument("--requests", type=int, default=192)
    parser.add_argument(
        "--seconds", type=float, default=300.0, help="wall seconds after which nothing is sent"
    )
    parser.add_argument("--request-timeout", type=float, default=120.0, help="wall seconds")
    parser.add_argument(
        "--slo", type=float, nargs=2, default=(1000.0, 60.0), metavar=("TTFT_MS", "TPOT_MS"),
        help="the goodput's SLO, modelled",
    )  # fmt: skip
    parser.add_argument("--gates", nargs="+", choices=list(GATES), default=list(GATES))
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--acceptance", choices=("matched", "raw"), default="matched")
    parser.add_argument("--prompt", type=int, nargs=2, default=(16, 96), metavar=("MIN", "MAX"))
    parser.add_argument("--output", type=int, nargs=2, default=(32, 96), metavar=("MIN", "MAX"))
    parser.add_argument("--seed", type=int, default=0, help="the workload's lengths and pauses")
    parser.add_argument("--out", type=Path, default=REPO / ".cache" / "sim-fidelity-cluster")
    args = parser.parse_args()
    env = check_cluster()
    for proxy in ("http_proxy", "https_proxy", "all_proxy"):  # only ever loopback, directly
        os.environ.pop(proxy, None)
        os.environ.pop(proxy.upper(), None)
    jobs = workload(
        args.requests, args.seed, tuple(args.prompt), tuple(args.output), args.think / 1e3
    )
    text_prompts(jobs)
    args.out.mkdir(parents=True, exist_ok=True)
    body = specdeployment(args, GATES[args.gates[0]])
    setup = Setup(env, args.out / "operator.log", body, prefix="sim-fidelity")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` cleans up
    try:
        asyncio.run(main_async(args, setup, jobs))
    finally:
        setup.close()


if __name__ == "__main__":
    main()
