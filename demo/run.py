"""`make demo`: the operator doing its job on the local cluster, phase by phase, with a
live view and a report in .cache/demo/.

Set-up (built or started when missing, each step timed): the cluster's binaries, the tiny
models, the local cluster. Then the chart is installed, its operator runs here as the chart's
ServiceAccount (kwok runs no containers), examples/autotune-demo.yaml is applied and the
phases of phases.STORY reshape the fleet and the traffic, each waiting for the operator's
calibration to finish. Last, each phase's traffic is replayed on an engine of its SKU of the
demo's own under the operator's threshold, never and always speculating (the counterfactual).

Ctrl-C stops everything, the cluster included; a finished demo leaves the cluster up
(`make demo-down` stops it)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from spectune.demo import cluster as k8s
from spectune.demo.phases import STORY, Phase
from spectune.demo.report import write_report
from spectune.demo.timeline import (
    TRIGGERED,
    Counterfactual,
    Mark,
    PhaseResult,
    Sample,
    Step,
    Timeline,
)
from spectune.demo.traffic import Fleet, Shadow
from spectune.demo.verdict import verdict
from spectune.demo.view import short_sku, status_line
from spectune.engine.bench.schema import Slo

TICK_SECONDS = 5.0
SETTLE_TICKS = 1  # after the operator's reaction: the phase's steady state under its threshold
DECIDED = ("ThresholdChanged", "ThresholdKept", "ThresholdRecommended", "RolledBack")


def say(text: str) -> None:
    print(text, flush=True)


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class Demo:
    def __init__(self, args: argparse.Namespace, cluster: k8s.Cluster, body: dict[str, Any]):
        self.args, self.cluster, self.created = args, cluster, body
        self.name = body["metadata"]["name"]
        spec = body["spec"]
        self.time_scale = float(spec["engine"]["podAnnotations"]["spectune.io/simulate-time-scale"])
        self.slo = Slo(
            ttft_ms=spec["slo"]["ttftMilliseconds"], tpot_ms=spec["slo"]["tpotMilliseconds"]
        )
        self.sku, self.replicas = (
            spec["engine"]["nodeSelector"]["nvidia.com/gpu.product"],
            spec["replicas"],
        )
        self.fleet = Fleet(self.slo)
        self.t0 = time.time()
        self.timeline = Timeline(
            started_at=datetime.now(UTC).isoformat(timespec="seconds"), time_scale=self.time_scale
        )
        self.seen = 0  # marks already in the timeline

    def now(self) -> float:
        return time.time() - self.t0

    def event_clock(self, when: datetime) -> float:
        return when.timestamp() - self.t0

    async def status(self) -> dict[str, Any]:
        return (await asyncio.to_thread(self.cluster.get, self.name)).get("status") or {}

    async def new_marks(self, phase: str) -> list[str]:
        marks = await asyncio.to_thread(self.cluster.marks, self.created, self.event_clock)
        fresh = marks[self.seen :]
        self.seen = len(marks)
        for m in fresh:
            self.timeline.marks.append(m.model_copy(update={"phase": phase}))
        return [f"{m.reason}: {m.message}" for m in fresh]

    async def reshape(self, phase: Phase) -> None:
        if phase.sku != self.sku:
            await asyncio.to_thread(
                self.cluster.patch,
                self.name,
                {"engine": {"nodeSelector": {"nvidia.com/gpu.product": phase.sku}}},
            )
            self.sku = phase.sku
        if phase.replicas != self.replicas:
            await asyncio.to_thread(self.cluster.scale, self.name, phase.replicas)
            self.replicas = phase.replicas

    async def play(self, number: int, phase: Phase, phases: int) -> PhaseResult:
        """Make the phase true, then tick until the operator reacted and the phase settled."""
        await self.reshape(phase)
        started = self.now()
        samples: list[Sample] = []
        reacted_at: float | None = None
        latest: str | None = None
        settled = 0
        while True:
            pods = await asyncio.to_thread(self.cluster.pods, self.name)
            clients = phase.clients_at(self.now() - started)
            await self.fleet.set([u for _, u, _ in pods], clients, phase.temperature)
            await asyncio.sleep(TICK_SECONDS)
            tick = await self.fleet.tick({u: p for _, u, p in pods})
            status = await self.status()
            events = await self.new_marks(phase.name)
            latest = events[-1] if events else latest
            per_sku = {s["sku"]: s.get("batchSize") for s in status.get("perSku", [])}
            sample = Sample(
                t=round(self.now(), 1),
                phase=phase.name,
                clients=clients,
                replicas=len(pods),
                batch=tick.batch,
                overrun_percent=tick.overrun_percent,
                threshold=(status.get("threshold") or {}).get("current"),
                crossover=per_sku,
                goodput_rps=round(tick.goodput_rps, 3),
                requests=tick.requests,
                event=latest,
            )
            samples.append(sample)
            self.timeline.samples.append(sample)
            say(status_line(sample, number, phases, phase.name))
            if reacted_at is None and decided(self.timeline.marks, phase.name, status):
                reacted_at = self.now()
                say(f"  -> the operator reacted after {reacted_at - started:.0f} s")
            if reacted_at is not None:
                settled += 1
                if settled >= SETTLE_TICKS:
                    break
            elif self.now() - started > phase.max_seconds:
                say(f"  -> no completed calibration within {phase.max_seconds:.0f} s; moving on")
                break
        return self.result(phase, started, samples, status)

    def result(
        self, phase: Phase, started: float, samples: list[Sample], status: dict[str, Any]
    ) -> PhaseResult:
        steady = samples[1:] or samples
        batches = [s.batch[phase.sku] for s in steady if phase.sku in s.batch]
        overruns = [s.overrun_percent[phase.sku] for s in steady if phase.sku in s.overrun_percent]
        mine = next((s for s in status.get("perSku", []) if s["sku"] == phase.sku), {})
        seconds = TICK_SECONDS * len(samples)
        return PhaseResult(
            name=phase.name,
            title=phase.title,
            started=round(started, 1),
            ended=round(self.now(), 1),
            sku=phase.sku,
            replicas=phase.replicas,
            clients=list(phase.clients),
            temperature=phase.temperature,
            threshold=mine.get("threshold", (status.get("threshold") or {}).get("current")),
            crossover=mine.get("batchSize"),
            crossover_reason=mine.get("reason", ""),
            mean_batch=round(sum(batches) / len(batches), 1) if batches else 0.0,
            peak_batch=max(batches, default=0.0),
            overrun_percent=round(sum(overruns) / len(overruns), 1) if overruns else 0.0,
            goodput_rps=round(sum(s.goodput_rps for s in samples) * TICK_SECONDS / seconds, 3),
        )

    async def counterfactuals(self) -> None:
        """Each phase's traffic per engine on an engine of its SKU: the operator's threshold,
        never and always, one after another (the order rotating between phases), each through
        the phase's levels of clients."""
        shadows: dict[str, Shadow] = {}
        try:
            for i, result in enumerate(self.timeline.phases):
                if result.sku not in shadows:
                    say(
                        f"  starting a counterfactual engine on a simulated {short_sku(result.sku)}"
                    )
                    shadows[result.sku] = Shadow(
                        result.sku, self.time_scale, self.args.out, k8s.OPERATOR_PID.parent
                    )
                    await shadows[result.sku].ready()
                shadow = shadows[result.sku]
                clients = [max(1, c // result.replicas) for c in result.clients]
                policies: dict[str, int | None] = {
                    "never": 0,
                    "always": None,
                    "auto": result.threshold,
                }
                t = result.threshold
                if t is None or t <= 1 or t > max(clients):
                    # never (no batch is below 1), or above every batch this load makes: always
                    del policies["auto"]
                order = list(policies)[i % len(policies) :] + list(policies)[: i % len(policies)]
                runs = {}
                for name in order:
                    runs[name] = await shadow.goodput(
                        policies[name],
                        clients,
                        result.temperature,
                        self.args.counterfactual_seconds,
                        self.slo,
                    )
                if "auto" not in runs:
                    runs["auto"] = runs["never" if t is not None and t <= 1 else "always"]
                result.counterfactual = Counterfactual(
                    auto=round(runs["auto"].goodput_rps, 3),
                    never=round(runs["never"].goodput_rps, 3),
                    always=round(runs["always"].goodput_rps, 3),
                    threshold=result.threshold,
                    seconds=self.args.counterfactual_seconds,
                    clients=clients,
                    overrun_percent={k: round(runs[k].overrun_percent, 1) for k in order},
                    gpu_tokens_per_s={k: round(r.gpu_tokens_per_s, 1) for k, r in runs.items()},
                )
                say(
                    f"  {result.name} ({'/'.join(map(str, clients))} clients per engine): "
                    + "; ".join(
                        f"{k} {r.goodput_rps:.2f} req/s, {r.gpu_tokens_per_s:.0f} GPU tok/s "
                        f"({r.overrun_percent:.0f}% overrun)"
                        for k, r in runs.items()
                    )
                )
        finally:
            for s in shadows.values():
                s.stop()


def decided(marks: list[Mark], phase: str, status: dict[str, Any]) -> bool:
    """Whether a calibration started in this phase came to a decision and has finished (its
    goodput check included): a failed one is retried by the operator, so it is waited out."""
    mine = [m.reason for m in marks if m.phase == phase]
    if TRIGGERED not in mine:
        return False
    after = mine[len(mine) - mine[::-1].index(TRIGGERED) :]
    phase_now = (status.get("calibration") or {}).get("phase")
    return any(r in DECIDED for r in after) and phase_now == "Idle"


async def play_all(demo: Demo, story: tuple[Phase, ...]) -> None:
    try:
        for number, phase in enumerate(story, 1):
            say(
                f"\n== phase {number}/{len(story)}: {phase.title} "
                f"({short_sku(phase.sku)}, {phase.replicas} replica(s), "
                f"{'/'.join(map(str, phase.clients))} clients, "
                f"temperature {phase.temperature:g})"
            )
            demo.timeline.phases.append(await demo.play(number, phase, len(story)))
    finally:
        await demo.fleet.stop()
    say("\n== counterfactual: each phase's traffic under never and always speculating")
    await demo.counterfactuals()


def phases_named(text: str) -> tuple[Phase, ...]:
    known = {p.name: p for p in STORY}
    names = [n for n in text.split(",") if n]
    if not names or any(n not in known for n in names):
        raise argparse.ArgumentTypeError(f"phases: expected names of {', '.join(known)}")
    return tuple(known[n] for n in names)


def main() -> None:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--phases",
        type=phases_named,
        default=STORY,
        help=f"comma-separated, of {','.join(p.name for p in STORY)} (default: all, in order)",
    )
    parser.add_argument(
        "--window", type=int, help="tuning.calibrationWindowSeconds instead of the example's"
    )
    parser.add_argument("--out", type=Path, default=k8s.REPO / ".cache" / "demo")
    parser.add_argument(
        "--counterfactual-seconds",
        type=float,
        default=3.0,
        help="each policy's run at each of a phase's levels of clients (default: 3)",
    )
    parser.add_argument(
        "--no-set-up", dest="set_up", action="store_false", help="the cluster is up already (tests)"
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stopped: clean up as on Ctrl-C
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    interrupted = False
    cluster = None
    try:
        say("== set-up: what is missing is built or started")
        steps = k8s.prepare(say) if args.set_up else []
        cluster = k8s.Cluster(args.out)
        t = time.monotonic()
        cluster.install_chart()
        health, metrics = free_ports(2)
        log = cluster.start_operator(health, metrics)
        body = cluster.fresh_deployment(args.window)
        steps.append(
            Step(
                name="the chart, its operator and the SpecDeployment",
                seconds=round(time.monotonic() - t, 1),
            )
        )
        say(f"  {steps[-1].name}: {steps[-1].seconds:.0f} s (operator log: {log})")
        demo = Demo(args, cluster, body)
        demo.timeline.cold_steps = steps
        asyncio.run(play_all(demo, args.phases))
        demo.timeline.total_seconds = round(time.monotonic() - began, 1)
        min_changes = min(3, len(args.phases))
        paths = write_report(demo.timeline, args.out, min_changes=min_changes)
        result = verdict(demo.timeline, min_changes=min_changes)
        say("\n" + "\n".join(result.lines()))
        cluster.remove(demo.name)  # its engines stop; the cluster stays up for the next run
        say(f"\nreport: {paths[0]}  ({demo.timeline.total_seconds / 60:.1f} min in all)")
    except KeyboardInterrupt:
        interrupted = True
        say("\ninterrupted: stopping the load, the operator and the cluster")
    except (k8s.DemoError, RuntimeError) as err:
        sys.exit(f"make demo: {err}")
    except ApiException as err:
        sys.exit(f"make demo: the API server answered {err.status} {err.reason}: {err.body}")
    finally:
        if cluster is not None:
            cluster.stop_operator()
        if interrupted:
            subprocess.run([str(k8s.REPO / "hack" / "cluster.sh"), "down"], check=False)
    if interrupted:
        sys.exit(130)


if __name__ == "__main__":
    main()
