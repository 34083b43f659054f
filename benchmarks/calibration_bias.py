"""How far a calibration's measured speedup sits from steady speculation's, batch by batch.

A calibration measures speculation against plain decoding with both modes interleaved (half
the iterations each, `CALIBRATION_EXPLORATION_PERCENT`); the threshold it picks then runs one
mode steadily. On one simulated pod (spectune-sim's engine, a device-time model), a closed loop
of N clients that never pause holds the running batch at N, so each bucket compares the same
batches: three runs per N, plain only, speculation only and the calibration's 50% mix, each
the same requests. Each prints the bucket's speedup (speculating tokens/s over plain, read
as the operator reads it: the draft's catch-up kept out, and the draft prefill a mix's spec
steps carry beyond steady speculation's, `steady_prefill_excess`) steady and mixed, what
makes the difference (a spec step's time and its tokens), and what goodput counts: the
requests' TPOT, median and p90, steady speculation's over plain decoding's (each request
drafts at its own rate, so speculation spreads TPOT where plain decoding does not:
`tuning.requiredGainPercent`).

    .venv/bin/python benchmarks/calibration_bias.py                     # L4, acceptance 0.6
    .venv/bin/python benchmarks/calibration_bias.py --sku A100 --acceptance 0.7 --spread 0 \\
        --prompt 256 256 --output 128 128 --batches 48 56 64

Every number here is SIMULATED (the SKU's roofline of a well-tuned engine), not a measurement.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

from spectune.engine import contract as c
from spectune.engine.device_time import sku_named
from spectune.engine.gate import GateSettings
from spectune.operator.window import steady_prefill_excess
from spectune.sim.engine_pod import PodConfig, Request, SimEngine


@dataclass(frozen=True)
class Bucket:
    """One mode's decode steps in one batch bucket, as the operator reads them."""

    steps: float
    seconds: float  # as the operator reads them
    tokens: float

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds


@dataclass(frozen=True)
class Run:
    buckets: dict[str, Bucket]  # mode -> the bucket holding the loop's batch
    tpot: list[float]  # each request's seconds per output token after its first, sorted

    def tpot_at(self, q: float) -> float:
        return self.tpot[min(len(self.tpot) - 1, int(q * len(self.tpot)))]


def closed_loop(args: argparse.Namespace, clients: int, gate: GateSettings) -> Run:
    """`args.requests` requests from `clients` clients that each send the next as soon as one
    finishes; the bucket holding batch `clients` per mode, and the requests' TPOT (past the
    first tenth, while the loop fills)."""
    config = PodConfig(
        sku=sku_named(args.sku),
        method="draft",
        k=args.k,
        max_batch_size=clients,
        kv_cache_bytes=args.kv_gib * 2**30,
        max_model_len=8192,
        max_queue=args.requests,
        ttft_s=3.0,
        tpot_s=0.15,
    )
    engine = SimEngine("pod", config, gate, seed=0)
    rng = random.Random(0)  # the same requests under every gate
    sent: list[Request] = []

    def send(now: float) -> None:
        rate = min(1.0, max(0.0, args.acceptance + rng.uniform(-args.spread, args.spread)))
        prompt, output = rng.randint(*args.prompt), rng.randint(*args.output)
        sent.append(Request(len(sent), now, prompt, output, rate))
        engine.submit(sent[-1], now)

    now, finished = 0.0, 0
    for _ in range(clients):
        send(now)
    while (seconds := engine.step(now)) is not None:
        now += seconds
        done = sum(1 for r in sent if r.done_at is not None)
        for _ in range(done - finished):
            if len(sent) < args.requests:
                send(now)
        finished = done
    bucket = str(c.batch_bucket(clients))
    series = engine.series.values

    def value(metric: str, **labels: str) -> float:
        return series.get((metric, tuple(sorted((labels | {"batch": bucket}).items()))), 0.0)

    tokens = {mode: value(c.STEP_OUTPUT_TOKENS, mode=mode) for mode in ("plain", "spec")}
    prefill = value(c.DRAFT_PREFILL_SECONDS)
    out = {}
    for mode in ("plain", "spec"):
        steps = value(f"{c.STEP_SECONDS}_count", mode=mode)
        if steps:
            seconds = value(f"{c.STEP_SECONDS}_sum", mode=mode)  # the catch-up already out
            if mode == "spec":
                seconds -= steady_prefill_excess(prefill, tokens["spec"], tokens["plain"])
            out[mode] = Bucket(steps, seconds, tokens[mode])
    tpot = [
        (r.done_at - r.first_token_at) / (r.output_tokens - 1)
        for r in sent[len(sent) // 10 :]
        if r.done_at is not None and r.first_token_at is not None and r.output_tokens > 1
    ]
    return Run(out, sorted(tpot))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sku", default="L4")
    p.add_argument("--acceptance", type=float, default=0.6, help="per drafted token, mean")
    p.add_argument("--spread", type=float, default=0.1, help="requests' rates +/- this")
    p.add_argument("--prompt", type=int, nargs=2, default=[600, 1600], metavar=("MIN", "MAX"))
    p.add_argument("--output", type=int, nargs=2, default=[100, 300], metavar=("MIN", "MAX"))
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--kv-gib", type=int, default=40, help="KV cache per pod (no preemption)")
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--batches", type=int, nargs="+", default=[4, 8, 12, 16])
    args = p.parse_args()
    print(
        f"{args.sku}, draft k={args.k}, acceptance {args.acceptance} +/- {args.spread}, prompts "
        f"{args.prompt[0]}-{args.prompt[1]}, outputs {args.output[0]}-{args.output[1]}, "
        f"{args.requests} requests a run (SIMULATED)\n"
    )
    print(
        "| batch | speedup, steady | speedup, calibration's mix | mix / steady | "
        "spec step ms, steady / mix | spec tokens a step, steady / mix | "
        "TPOT p50 / p90, steady over plain |"
    )
    print("|---|---|---|---|---|---|---|")
    for n in args.batches:
        plain = closed_loop(args, n, GateSettings(threshold=0))
        steady = closed_loop(args, n, GateSettings(threshold=None))
        mixed = closed_loop(args, n, GateSettings(threshold=None, exploration=0.5)).buckets
        p, spec = plain.buckets["plain"], steady.buckets["spec"]
        s, m = spec.rate / p.rate, mixed["spec"].rate / mixed["plain"].rate
        p50, p90 = (steady.tpot_at(q) / plain.tpot_at(q) for q in (0.5, 0.9))
        print(
            f"| {n} | {s:.3f} | {m:.3f} | {m / s:.3f} | "
            f"{1000 * spec.seconds / spec.steps:.1f} / "
            f"{1000 * mixed['spec'].seconds / mixed['spec'].steps:.1f} | "
            f"{spec.tokens / spec.steps:.2f} / {mixed['spec'].tokens / mixed['spec'].steps:.2f} | "
            f"{p50:.3f} / {p90:.3f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
