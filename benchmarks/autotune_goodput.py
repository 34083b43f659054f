"""Goodput of the threshold Auto measures against fixed thresholds, on the same traffic
(issue 13, "Must show" 2; recorded in docs/PERFORMANCE.md).

On the running local cluster (`make cluster-up`): the operator calibrates an Auto
SpecDeployment on a simulated A100 (n-gram lookup, k=16, sampled requests: a crossover the
load of this machine reaches) under closed-loop load stepping through 16/28/44/64 clients.
The deployment is then pinned (Manual, at the measured value, so the operator stops pushing)
and each policy (the measured threshold, never, always, and fixed thresholds) serves the same
load levels in turns through the engine's admin API, the order rotating between rounds.
Goodput is SLO-met requests per second. Simulated clock: the numbers are the device model's
A100, slowed `--time-scale` times, not this CPU's. They hold only while the CPU keeps up with
that clock, so the engine's overruns are counted and printed (at 4x, k=16 spec steps overran
about twice a second, which slowed the speculating policies against plain decoding).

With `--exploration-cost` it measures what a calibration costs instead: the same levels at the
measured threshold, exploration at its base (2%) and at what a calibration raises it to (50%),
in turns.

With `--context-shift` it checks issue 13's "Must show" 5 for longer contexts: the engine
counts each real cached token `--context-scale` times on the simulated A100 (the tiny models
were trained on 128-token sequences; serving contexts run to thousands), the operator calibrates
under stepped load with `--short-prompt-bytes` prompts, and once that measurement is verified
the same clients send `--long-prompt-bytes` prompts; the prompt-length trigger must start a
calibration, and the thresholds before and after are printed (the device model says: higher,
where acceptance holds). Longer text also changes what n-gram lookup finds: it drafts more in
longer text, which cancels the extra KV reads. `--draft tiny-draft --k 12` speculates with the
draft model instead, which drafts k tokens whatever the text and accepts about as many of them
in short and long prompts (its slower steps want a longer `--window`, 240 s, and
`--level-seconds`, so that the largest batches get steps in both modes). `--pad-prompts`
makes the long prompts the short ones padded in front with a byte no text holds, so that
n-gram lookup finds the same matches (the built-in target still samples differently after
bytes it never saw: acceptance fell with padding too, docs/PERFORMANCE.md).

With `--real-cpu` it checks issue 13's "Must show" 1 on real CPU timing instead: the engine runs
without a simulated SKU (n-gram, k=4, greedy requests, the bench's CPU SLO), the operator
calibrates it under stepped load, and `spectune-engine bench --url` then measures the crossover
on the same engine (pinned, never and always in turns, from the engine's own per-bucket steps);
the two crossovers and the buckets between them are printed.

With `--hover-minutes N` it measures flapping instead (issue 13, "Must show" 10): after the
calibration the deployment stays Auto, with the default damping (`tuning.minDwellSeconds`
300, a one-bucket dead band), while the load alternates between two levels either side of
the crossover for N minutes, and the operator's Events are counted. Each level lasts
`--hover-level-seconds` (default `--level-seconds`, 2.5 modelled seconds: fast swings that
whole windows average out; one calibration window each: slow swings that each window sees on
one side), and
`--hover-max-age` lowers `tuning.maxAgeSeconds` so that re-checks come while it hovers and the
damping itself decides what they move.

Usage: .venv/bin/python benchmarks/autotune_goodput.py [--levels 16,64] [--fixed 48]
       [--seconds 40] [--rounds 2] [--time-scale 16] [--out .cache/autotune-goodput]
       [--hover-minutes 10 --hover-levels 28,44 --hover-level-seconds 120 --hover-max-age 60]
       [--exploration-cost] [--real-cpu] [--context-shift --context-scale 4]
       [--draft tiny-draft --k 12 --window 240 --level-seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import random
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client, config

from spectune.engine import contract
from spectune.engine.bench.loadgen import Bounds, Load, run_level, summarize
from spectune.engine.bench.schema import LevelResult, Slo
from spectune.engine.bench.targets import HttpTarget
from spectune.engine.bench.workload import (
    Prompt,
    parse_lengths,
    request_stream,
    shipped_prompts,
)
from spectune.engine.crossover import Crossover, bucket_distance
from spectune.operator import render
from spectune.operator.autotune import CALIBRATION_EXPLORATION_PERCENT
from spectune.operator.launch import launch
from spectune.operator.leadership import Leases
from spectune.operator.models import GROUP, PLURAL, VERSION, TuningSpec

REPO = Path(__file__).resolve().parents[1]
CALIBRATION_LEVELS = (16, 28, 44, 64)
TEMPERATURE, OUTPUT_TOKENS, PORT = 1.0, "48", 8000
PAD = "\x01"  # a byte no prompt or answer holds
# Real CPU timing: the tiny pair's n-gram k=4 crossover, greedy, lies near batch 24-27 on this
# machine (PERFORMANCE.md, "The central claim"); the bench's CPU SLO.
CPU_LEVELS, CPU_K, CPU_SLO = (4, 8, 16, 32, 64), 4, Slo(ttft_ms=1000, tpot_ms=100)


def slo(time_scale: float) -> Slo:
    """A modelled 2 s to the first token and 40 ms per token, on the slowed wall clock."""
    return Slo(ttft_ms=round(2000 * time_scale), tpot_ms=round(40 * time_scale))


def specdeployment(
    name: str,
    time_scale: float,
    damped: bool,
    target: Slo,
    real_cpu: bool = False,
    window_s: int | None = None,
    context_scale: float = 1.0,
    draft: str | None = None,
    k: int = 16,
) -> dict[str, Any]:
    """The benchmark's SpecDeployment; calibration windows of 30 modelled seconds unless
    `window_s` (wall seconds) is given; n-gram lookup unless a `draft` model is named."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SpecDeployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "model": {"name": "tiny-target"},
            "engine": {
                "gpus": 1,
                "maxBatchSize": 96,
                "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"},
                "podAnnotations": {
                    "spectune.io/simulate-gpu": "true",
                    "spectune.io/simulate-time-scale": f"{time_scale:g}",
                },
            },
            "speculation": {
                "method": "draft" if draft else "ngram",
                "numSpeculativeTokens": k,
                "threshold": {"mode": "Auto", "value": 1, "min": 1, "max": 96},
            },
            "slo": {
                "ttftMilliseconds": target.ttft_ms,
                "tpotMilliseconds": target.tpot_ms,
            },
            "tuning": {"calibrationWindowSeconds": window_s or round(30 * time_scale)}
            | ({} if damped else {"minDwellSeconds": 0}),
        },
    }
    if draft:
        body["spec"]["speculation"]["draft"] = draft
    if context_scale != 1.0:
        annotations = body["spec"]["engine"]["podAnnotations"]
        annotations["spectune.io/simulate-context-scale"] = f"{context_scale:g}"
    if real_cpu:
        del body["spec"]["engine"]["podAnnotations"]
        body["spec"]["speculation"]["numSpeculativeTokens"] = CPU_K
        body["spec"]["tuning"]["calibrationWindowSeconds"] = 120
    return body


def cluster_env() -> dict[str, str]:
    path = REPO / ".local" / "cluster.env"
    if not path.exists():
        sys.exit("autotune_goodput: no local cluster: run `make cluster-up` first")
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def wait(what: str, probe: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := probe():
            return value
        time.sleep(1)
    sys.exit(f"autotune_goodput: timed out after {timeout:.0f} s waiting for {what}")


class Setup:
    """A namespace, a SpecDeployment and an operator watching it; all removed on exit."""

    def __init__(
        self, env: dict[str, str], log: Path, body: dict[str, Any], prefix: str = "autotune-goodput"
    ) -> None:
        kubectl = [str(REPO / ".local" / "bin" / "kubectl"), "--kubeconfig",
                   env["SPECTUNE_KUBECONFIG"]]  # fmt: skip
        crd = REPO / "crds" / "specdeployments.spectune.io.yaml"  # a fresh cluster
        subprocess.run([*kubectl, "apply", "--server-side", "-f", str(crd)],
                       check=True, capture_output=True)  # fmt: skip
        config.load_kube_config(env["SPECTUNE_KUBECONFIG"])
        self.core, self.custom = client.CoreV1Api(), client.CustomObjectsApi()
        self.namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.name = body["metadata"]["name"]
        self.core.create_namespace({"metadata": {"name": self.namespace}})
        Leases(self.namespace, "spectune-operator", client.ApiClient()).create_released()
        self.operator = launch(
            env["SPECTUNE_KUBECONFIG"],
            ["--namespace", self.namespace, "--leader-election-namespace", self.namespace,
             "--prometheus-url", env["SPECTUNE_PROMETHEUS_URL"],
             "--liveness", "http://127.0.0.1:8299/healthz"],
            log,
        )  # fmt: skip
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)

    def exists(self) -> bool:
        try:
            self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.name
            )
        except client.ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    def status(self) -> dict[str, Any]:
        sd = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.name
        )
        return sd.get("status") or {}

    def condition(self, kind: str) -> dict[str, Any]:
        return next((c for c in self.status().get("conditions", []) if c["type"] == kind), {})

    def pod_url(self) -> str | None:
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector=render.selector_string(self.name)
        ).items
        ready = [
            p for p in pods
            if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        ]  # fmt: skip
        if len(ready) != 1 or not ready[0].status.pod_ip.startswith("127."):
            return None
        return f"http://{ready[0].status.pod_ip}:{PORT}"

    def events(self) -> list[tuple[str, str]]:
        """(reason, message) of the SpecDeployment's Events, oldest first."""
        events = self.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={self.name}"
        ).items
        ordered = sorted(events, key=lambda e: e.metadata.creation_timestamp)
        return [(e.reason, e.message) for e in ordered]

    def tune(self, tuning: dict[str, int]) -> None:
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.name, {"spec": {"tuning": tuning}}
        )

    def token(self) -> str:
        secret = self.core.read_namespaced_secret(
            render.child_names(self.name)["token"], self.namespace
        )
        return base64.b64decode(secret.data[render.TOKEN_KEY]).decode()

    def pin(self, threshold: int) -> None:
        """Manual at the measured value: the operator stops pushing thresholds."""
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.name,
            {"spec": {"speculation": {"threshold": {"mode": "Manual", "value": threshold}}}},
        )  # fmt: skip

    def close(self) -> None:
        """The SpecDeployment first, while the operator runs to remove its finalizer (else
        the namespace would stay Terminating), then the operator, the namespace (and
        its Lease)."""
        self.custom.delete_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.name
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.exists():
            time.sleep(0.5)
        self.operator.stop()
        self.core.delete_namespace(self.namespace)


async def level(
    target: HttpTarget,
    clients: int,
    seconds: float,
    seed: str,
    temperature: float = TEMPERATURE,
    prompt_bytes: int = 64,
    pad_bytes: int = 0,
) -> list[Any]:
    """One closed-loop level; the same requests (prompts, lengths) for every policy. Padding
    goes in front of each prompt, in a byte no text holds: n-gram lookup never matches it, so
    the context grows but not what drafting finds."""
    rng = random.Random(seed)
    prompts = [Prompt(PAD * pad_bytes + p.text) for p in shipped_prompts(64, prompt_bytes)]
    rng.shuffle(prompts)
    specs = request_stream(prompts, parse_lengths(OUTPUT_TOKENS), rng, temperature)
    return await run_level(target, Load("closed", clients), specs, Bounds(10**6, seconds, 120))


async def calibrate(
    target: HttpTarget,
    setup: Setup,
    step_s: float,
    levels: tuple[int, ...] = CALIBRATION_LEVELS,
    temperature: float = TEMPERATURE,
    prompt_bytes: int = 64,
) -> dict[str, Any]:
    """Stepped load until the operator reports Calibrated; its status then."""
    started = time.monotonic()
    for i, clients in enumerate(itertools.cycle(levels)):
        await level(target, clients, step_s, f"calibration/{i}", temperature, prompt_bytes)
        done = await asyncio.to_thread(setup.condition, "Calibrated")
        if done.get("status") == "True":
            return await asyncio.to_thread(setup.status)
        if time.monotonic() - started > 900:
            sys.exit("autotune_goodput: no calibration within 900 s (see the operator's log)")
        print(f"  calibrating: {time.monotonic() - started:.0f} s, {clients} clients", flush=True)
    raise AssertionError("unreachable")


async def compare(
    target: HttpTarget,
    policies: dict[str, int | None],
    levels: list[int],
    seconds: float,
    rounds: int,
    slo: Slo,
) -> list[tuple[str, LevelResult]]:
    """(policy name, its result) for every level, round and policy."""
    rows = []
    names = list(policies)
    for clients, turn in itertools.product(levels, range(rounds)):
        order = names[turn % len(names) :] + names[: turn % len(names)]
        for name in order:
            await target.set_threshold(policies[name])
            results = await level(target, clients, seconds, f"{clients}/{turn}")
            row = summarize(results, "gated", policies[name], Load("closed", clients), slo, None)
            rows.append((name, row))
            print(f"  {clients:3d} clients  {name:>8}: {row.goodput_rps:.3f} goodput req/s, "
                  f"{row.output_tokens_per_s:.0f} tok/s", flush=True)  # fmt: skip
    return rows


def report(rows: list[tuple[str, LevelResult]], policies: dict[str, int | None]) -> list[str]:
    """Median goodput per level and policy, and the measured threshold against the best
    fixed one per level and over all levels."""
    header = "| clients | " + " | ".join(policies) + " | auto / best fixed |"
    lines = [header, "|---" * (len(policies) + 2) + "|"]
    totals = dict.fromkeys(policies, 0.0)
    for clients in sorted({r.load for _, r in rows}):
        med = {
            p: statistics.median(r.goodput_rps for n, r in rows if r.load == clients and n == p)
            for p in policies
        }
        for p, v in med.items():
            totals[p] += v
        best = max(v for p, v in med.items() if p != "auto")
        ratio = med["auto"] / best if best else float("nan")
        lines.append(f"| {clients:.0f} | " + " | ".join(f"{med[p]:.3f}" for p in policies)
                     + f" | {ratio:.3f} |")  # fmt: skip
    best = max(v for p, v in totals.items() if p != "auto")
    lines.append("| all | " + " | ".join(f"{totals[p]:.3f}" for p in policies)
                 + f" | {totals['auto'] / best:.3f} |")  # fmt: skip
    return lines


async def main_async(args: argparse.Namespace, setup: Setup) -> None:
    url = wait("the engine pod ready", setup.pod_url, 180)
    async with HttpTarget(url, None, setup.token(), 120) as target:
        print(f"engine at {url}; calibrating under stepped load ...", flush=True)
        began = time.monotonic()
        if args.real_cpu:
            status = await calibrate(target, setup, 10.0, CPU_LEVELS, temperature=0.0)
            setup.pin(status["threshold"]["current"])
            await asyncio.to_thread(agreement, url, setup, status, args)
            return
        status = await calibrate(
            target, setup, args.level_seconds, prompt_bytes=args.short_prompt_bytes
        )
        (a100,) = status["perSku"]
        measured = status["threshold"]["current"]
        print(f"calibrated after {time.monotonic() - began:.0f} s: threshold {measured} "
              f"({a100['reason']})", flush=True)  # fmt: skip
        if args.hover_minutes:
            await hover(target, setup, args)
            return
        if args.context_shift:
            await context_shift(target, setup, args, status)
            return
        setup.pin(measured)
        if args.exploration_cost:
            await exploration_cost(target, args)
            return
        policies: dict[str, int | None] = {"auto": measured, "never": 0, "always": None}
        policies |= {str(t): t for t in args.fixed if t != measured}
        before = await asyncio.to_thread(read_overruns, url)
        rows = await compare(
            target, policies, args.levels, args.seconds, args.rounds, slo(args.time_scale)
        )
        overruns = await asyncio.to_thread(read_overruns, url) - before
    table = report(rows, policies)
    print("\n".join(["", f"goodput, SLO-met requests/s (median of {args.rounds} rounds, "
                         f"{args.seconds:g} s each; simulated A100 at {args.time_scale:g}x; "
                         f"{overruns:.0f} iterations overran the modelled clock):",
                         *table]))  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "goodput.md").write_text("\n".join(table) + "\n")
    (args.out / "goodput.json").write_text(json.dumps({
        "threshold": measured, "crossover": a100, "policies": policies,
        "time_scale": args.time_scale, "overruns": overruns,
        "rows": [{"policy": n, **r.model_dump()} for n, r in rows],
    }, indent=2))  # fmt: skip


def read_overruns(url: str) -> float:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    return next(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(contract.SIMULATED_OVERRUNS + " ")
    )


async def hover(target: HttpTarget, setup: Setup, args: argparse.Namespace) -> None:
    """Load alternating either side of the crossover under Auto; the Events it caused, and
    each measurement's curve (how far a bucket's speedup moves between windows)."""
    before = len(await asyncio.to_thread(setup.events))
    if args.hover_max_age:
        await asyncio.to_thread(setup.tune, {"maxAgeSeconds": args.hover_max_age})
    started = time.monotonic()
    step_s = args.hover_level_seconds or args.level_seconds
    curves: dict[str, dict[str, float]] = {}  # measuredAt -> bucket -> speedup
    for i, clients in enumerate(itertools.cycle(args.hover_levels)):
        if time.monotonic() - started >= 60 * args.hover_minutes:
            break
        await level(target, clients, step_s, f"hover/{i}")
        seen = (await asyncio.to_thread(setup.events))[before:]
        crossover = (await asyncio.to_thread(setup.status)).get("crossover", {})
        if crossover.get("curve"):
            curves[crossover["measuredAt"]] = crossover["curve"]
        print(f"  hovering: {time.monotonic() - started:.0f} s, {clients} clients; "
              f"{len(seen)} events so far", flush=True)  # fmt: skip
    events = (await asyncio.to_thread(setup.events))[before:]
    reasons = [r for r, _ in events]
    counts = {r: reasons.count(r) for r in sorted(set(reasons))}
    status = await asyncio.to_thread(setup.status)
    print("\n".join(f"  {r}: {m}" for r, m in events))
    print(f"\nhovering {args.hover_minutes:g} min between {args.hover_levels} clients "
          f"({step_s:g} s each; maximum age {args.hover_max_age or 'default'}; simulated A100 "
          f"at {args.time_scale:g}x): events {counts}; "
          f"threshold now {status['threshold']['current']}")  # fmt: skip
    print(spread(list(curves.values())))
    (args.out / "hover.json").write_text(
        json.dumps({"events": events, "counts": counts, "curves": curves})
    )


def spread(curves: list[dict[str, float]]) -> str:
    """Per bucket over the measurements: how many, the mean speedup, and its spread."""
    lines = [f"speedup per bucket over {len(curves)} measurements (mean, sd, min-max):"]
    for bucket in sorted({b for c in curves for b in c}, key=int):
        values = [c[bucket] for c in curves if bucket in c]
        sd = statistics.stdev(values) if len(values) > 1 else float("nan")
        lines.append(f"  {bucket:>3}: n={len(values)} {statistics.fmean(values):.3f} "
                     f"sd {sd:.3f} {min(values):.3f}-{max(values):.3f}")  # fmt: skip
    return "\n".join(lines)


async def context_shift(
    target: HttpTarget, setup: Setup, args: argparse.Namespace, before: dict[str, Any]
) -> None:
    """Prompts turn long under the same stepped load: the calibration the prompt-length
    trigger starts, and the threshold it leaves."""
    step_s = args.level_seconds
    short, long = args.short_prompt_bytes, args.long_prompt_bytes
    longer = (
        {"prompt_bytes": short, "pad_bytes": long - short}
        if args.pad_prompts
        else {"prompt_bytes": long}
    )
    levels = itertools.cycle(CALIBRATION_LEVELS)
    for i, clients in enumerate(levels):  # the first measurement's verification, short prompts
        if (await asyncio.to_thread(setup.status))["calibration"]["phase"] == "Idle":
            break
        await level(target, clients, step_s, f"verify/{i}", prompt_bytes=short)
    seen = len(await asyncio.to_thread(setup.events))
    started = time.monotonic()
    padded = f" ({long - short} of them padding)" if args.pad_prompts else ""
    print(f"prompts now {long} bytes{padded}, were {short}", flush=True)
    decided: list[tuple[str, str]] = []
    # The trigger judges three whole windows after the measurement; then one calibration.
    limit = max(900, 4 * args.window + 300)
    for i, clients in enumerate(levels):
        await level(target, clients, step_s, f"long/{i}", **longer)
        events = (await asyncio.to_thread(setup.events))[seen:]
        reasons = [r for r, _ in events]
        if "CalibrationStarted" in reasons:
            decided = events[reasons.index("CalibrationStarted") :]
            if {"ThresholdChanged", "ThresholdKept"} & {r for r, _ in decided}:
                break
        if time.monotonic() - started > limit:
            sys.exit(f"autotune_goodput: no calibration within {limit} s of the longer prompts")
        print(f"  long prompts: {time.monotonic() - started:.0f} s, {clients} clients; "
              f"events {reasons}", flush=True)  # fmt: skip
    after = await asyncio.to_thread(setup.status)
    print("\n".join(f"  {r}: {m}" for r, m in decided))
    old, new = before["threshold"]["current"], after["threshold"]["current"]
    method = f"draft {args.draft}" if args.draft else "n-gram"
    print(f"\ncontext x{args.context_scale:g} on the simulated A100 (at {args.time_scale:g}x, "
          f"{method} k={args.k}): "
          f"{short}-byte prompts -> threshold {old} ({before['perSku'][0]['reason']}); "
          f"{long}-byte prompts{padded} -> {new} ({after['perSku'][0]['reason']}), "
          f"{time.monotonic() - started:.0f} s after the prompts turned long")  # fmt: skip
    (args.out / "context.json").write_text(json.dumps({
        "before": before, "after": after, "events": decided,
        "seconds": time.monotonic() - started,
    }, indent=2))  # fmt: skip


async def exploration_cost(target: HttpTarget, args: argparse.Namespace) -> None:
    """The same levels at the measured threshold, with exploration at its base and at what a
    calibration raises it to, in turns: the goodput a calibration window costs."""
    shares = {
        "base": TuningSpec().explorationPercent / 100,
        "calibrating": CALIBRATION_EXPLORATION_PERCENT / 100,
    }
    rows: list[tuple[str, LevelResult]] = []
    for clients, turn in itertools.product(args.levels, range(args.rounds)):
        for name in list(shares)[turn % 2 :] + list(shares)[: turn % 2]:
            # A calibration's share is a lease (both modes), the base explores plain only.
            lease = args.seconds + 60 if name == "calibrating" else None
            await target.set_exploration(shares[name], lease)
            results = await level(target, clients, args.seconds, f"{clients}/{turn}")
            row = summarize(
                results, "current", None, Load("closed", clients), slo(args.time_scale), None
            )
            rows.append((name, row))
            print(f"  {clients:3d} clients  {name:>11}: {row.goodput_rps:.3f} goodput req/s, "
                  f"{row.output_tokens_per_s:.0f} tok/s", flush=True)  # fmt: skip
    lines = ["| clients | goodput, base | goodput, calibrating | cost | tok/s cost |",
             "|---|---|---|---|---|"]  # fmt: skip
    for clients in args.levels:
        med = {
            (n, what): statistics.median(
                getattr(r, what) for m, r in rows if m == n and r.load == clients
            )
            for n in shares
            for what in ("goodput_rps", "output_tokens_per_s")
        }
        base, calibrating = med["base", "goodput_rps"], med["calibrating", "goodput_rps"]
        tokens = 1 - med["calibrating", "output_tokens_per_s"] / med["base", "output_tokens_per_s"]
        lines.append(
            f"| {clients} | {base:.3f} | {calibrating:.3f} | {1 - calibrating / base:+.1%} "
            f"| {tokens:+.1%} |"
        )
    print("\n".join(["", f"exploration {shares} (median of {args.rounds} rounds, "
                         f"{args.seconds:g} s each; simulated A100 at {args.time_scale:g}x):",
                         *lines]))  # fmt: skip
    (args.out / "exploration-cost.md").write_text("\n".join(lines) + "\n")


def agreement(url: str, setup: Setup, status: dict[str, Any], args: argparse.Namespace) -> None:
    """`spectune-engine bench --url` on the same engine: its load-sweep crossover (from the
    engine's per-bucket steps under never and always) against the operator's."""
    (ours,) = status["perSku"]
    print(f"operator: {ours['reason']} (threshold {status['threshold']['current']})", flush=True)
    token = args.out / "admin-token"
    token.unlink(missing_ok=True)
    token.touch(mode=0o600)  # never readable by others, not even for a moment
    token.write_text(setup.token())
    out = args.out / "bench-url"
    bench = [
        str(Path(sys.executable).with_name("spectune-engine")), "bench", "--url", url,
        "--sweep", "load", "--policies", "never,always", "--admin-token-file", str(token),
        "--concurrency", ",".join(map(str, CPU_LEVELS)), "--requests", "100000",
        "--duration-s", f"{args.seconds:g}", "--rounds", str(args.rounds),
        "--output-tokens", OUTPUT_TOKENS, "--temperature", "0",
        "--ttft-ms", str(CPU_SLO.ttft_ms), "--tpot-ms", str(CPU_SLO.tpot_ms), "--out", str(out),
    ]  # fmt: skip
    subprocess.run(bench, check=True)
    theirs = json.loads((out / "bench.json").read_text())["load_sweep"]["crossover"]
    a = Crossover("crosses", ours["batchSize"]) if ours.get("batchSize") else None
    b = Crossover(theirs["status"], theirs["batch"])
    apart = bucket_distance(a, b) if a is not None else None
    print(f"\nreal CPU timing: operator {ours['reason']}; bench --url {theirs}; "
          f"buckets apart: {apart}")  # fmt: skip
    (args.out / "real-cpu.json").write_text(
        json.dumps({"operator": ours, "bench_url": theirs, "buckets_apart": apart}, indent=2)
    )


def numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", type=numbers, default=[16, 64], help="clients")
    parser.add_argument("--fixed", type=numbers, default=[48], help="fixed thresholds")
    parser.add_argument("--seconds", type=float, default=40.0, help="per policy and level")
    parser.add_argument("--time-scale", type=float, default=16.0, help="the pod's slowdown")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / ".cache" / "autotune-goodput")
    parser.add_argument("--hover-minutes", type=float, default=0.0, help="measure flapping")
    parser.add_argument("--hover-levels", type=numbers, default=[28, 44], help="clients")
    parser.add_argument("--hover-level-seconds", type=float, help="how long each level lasts")
    parser.add_argument(
        "--hover-max-age", type=int, help="tuning.maxAgeSeconds while hovering (at least 60)"
    )
    parser.add_argument(
        "--exploration-cost", action="store_true", help="measure what calibrating costs"
    )
    parser.add_argument(
        "--real-cpu", action="store_true", help="the operator against bench --url, CPU timing"
    )
    parser.add_argument(
        "--context-shift", action="store_true", help="longer prompts: the threshold's move"
    )
    parser.add_argument(
        "--context-scale", type=float, default=4.0, help="modelled cached tokens per real one"
    )
    parser.add_argument("--short-prompt-bytes", type=int, default=64)
    parser.add_argument("--long-prompt-bytes", type=int, default=512)
    parser.add_argument(
        "--window", type=int, help="tuning.calibrationWindowSeconds (default 30 modelled s)"
    )
    parser.add_argument(
        "--level-seconds", type=float, help="each calibration load level (default 2.5 modelled s)"
    )
    parser.add_argument("--draft", help="a draft model instead of n-gram lookup (tiny-draft)")
    parser.add_argument("--k", type=int, default=16, help="drafted tokens per step")
    parser.add_argument(
        "--pad-prompts", action="store_true", help="long prompts: the short ones, padded in front"
    )
    args = parser.parse_args()
    args.level_seconds = args.level_seconds or 2.5 * args.time_scale
    args.window = args.window or (60 if args.context_shift else None)  # wall seconds
    if args.context_shift and args.long_prompt_bytes <= args.short_prompt_bytes:
        parser.error("--long-prompt-bytes must be more than --short-prompt-bytes")
    if args.hover_max_age is not None and args.hover_max_age < 60:
        parser.error("--hover-max-age: tuning.maxAgeSeconds is at least 60")
    args.out.mkdir(parents=True, exist_ok=True)
    body = specdeployment(
        "bench",
        args.time_scale,
        bool(args.hover_minutes),
        CPU_SLO if args.real_cpu else slo(args.time_scale),
        args.real_cpu,
        args.window,
        args.context_scale if args.context_shift else 1.0,
        args.draft,
        args.k,
    )
    setup = Setup(cluster_env(), args.out / "operator.log", body)
    try:
        asyncio.run(main_async(args, setup))
    finally:
        setup.close()


if __name__ == "__main__":
    main()
