"""`make demo`: the operator doing its job on the local cluster, phase by phase, with a
live view and a report in .cache/demo/.

Set-up (built or started when missing, each step timed): the cluster's binaries, the tiny
models, the local cluster. Then the chart is installed, its operator runs here as the chart's
ServiceAccount (kwok runs no containers), examples/autotune-demo.yaml is applied and the
phases of phases.STORY reshape the fleet and the traffic, each waiting for the operator's
calibration to finish. Each phase's result says what the operator's threshold, never and
always speculating serve at the batches its engines ran at, from what they measured in each
mode there (the counterfactual, demo/counterfactual.py).

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
from spectune.demo.counterfactual import policies_on_batches
from spectune.demo.phases import STORY, Phase
from spectune.demo.report import write_report
from spectune.demo.timeline import (
    CHANGED,
    ROLLED_BACK,
    TRIGGERED,
    Mark,
    PhaseResult,
    Sample,
    Step,
    Timeline,
)
from spectune.demo.traffic import Fleet
from spectune.demo.verdict import verdict
from spectune.demo.view import short_sku, status_line
from spectune.engine.bench.loadgen import NO_COUNTERS, Counters
from spectune.engine.bench.schema import Slo

TICK_SECONDS = 5.0
SETTLE_TICKS = 1  # after the operator's reaction: the phase's steady state under its threshold
DECIDED = (CHANGED, "ThresholdKept", "ThresholdRecommended", ROLLED_BACK)


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
    def __init__(self, cluster: k8s.Cluster, body: dict[str, Any]):
        self.cluster, self.created = cluster, body
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

    @property
    def name(self) -> str:
        return self.created["metadata"]["name"]

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
        ran = NO_COUNTERS  # by the phase's engines, after its first tick (the reshaping)
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
            if samples:
                ran = ran + tick.counters.get(phase.sku, NO_COUNTERS)
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
        return self.result(phase, started, samples, ran, status)

    def result(
        self,
        phase: Phase,
        started: float,
        samples: list[Sample],
        ran: Counters,
        status: dict[str, Any],
    ) -> PhaseResult:
        steady = samples[1:] or samples
        batches = [s.batch[phase.sku] for s in steady if phase.sku in s.batch]
        overruns = [s.overrun_percent[phase.sku] for s in steady if phase.sku in s.overrun_percent]
        mine = next((s for s in status.get("perSku", []) if s["sku"] == phase.sku), {})
        seconds = TICK_SECONDS * len(samples)
        threshold = mine.get("threshold", (status.get("threshold") or {}).get("current"))
        return PhaseResult(
            name=phase.name,
            title=phase.title,
            started=round(started, 1),
            ended=round(self.now(), 1),
            sku=phase.sku,
            replicas=phase.replicas,
            clients=list(phase.clients),
            temperature=phase.temperature,
            threshold=threshold,
            crossover=mine.get("batchSize"),
            crossover_reason=mine.get("reason", ""),
            mean_batch=round(sum(batches) / len(batches), 1) if batches else 0.0,
            peak_batch=max(batches, default=0.0),
            overrun_percent=round(sum(overruns) / len(overruns), 1) if overruns else 0.0,
            goodput_rps=round(sum(s.goodput_rps for s in samples) * TICK_SECONDS / seconds, 3),
            counterfactual=policies_on_batches(ran, threshold, self.time_scale),
        )


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
            result = await demo.play(number, phase, len(story))
            demo.timeline.phases.append(result)
            if (c := result.counterfactual) is not None:
                tps = c.gpu_tokens_per_s
                say(
                    f"  on this phase's batches ({100 * c.compared:.0f}% of its decode time "
                    f"measured in both modes): auto {tps['auto']:.0f}, never {tps['never']:.0f}, "
                    f"always {tps['always']:.0f} decode tokens/s per engine (simulated clock)"
                )
    finally:
        await demo.fleet.stop()


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
        demo = Demo(cluster, body)
        demo.timeline.cold_steps = steps
        asyncio.run(play_all(demo, args.phases))
        demo.timeline.total_seconds = round(time.monotonic() - began, 1)
        min_changes = min(3, len(args.phases))
        paths = write_report(demo.timeline, args.out, min_changes=min_changes)
        result = verdict(demo.timeline, min_changes=min_changes)
        say("\n" + "\n".join(result.lines()))
        cluster.remove(demo.name)  # its engines stop; the cluster stays up for the next run
        say(f"\nreport: {paths[0]}  ({demo.timeline.total_seconds / 60:.1f} min in all)")
        if not result.ok:
            sys.exit("make demo: the run did not tell the story (verdict FAILED, above)")
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
