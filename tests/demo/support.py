"""A demo timeline built by hand, shaped like a real run: three phases (quiet, busy, moved to
another SKU), each threshold change after the calibration that its trigger started, one
calibration that kept the threshold, and a counterfactual per phase. The numbers are chosen
so each check has a known answer (busy: auto 1.02x never; moved: 0.99x never)."""

from __future__ import annotations

from spectune.demo.timeline import (
    Counterfactual,
    Mark,
    PhaseResult,
    PolicyAtBatch,
    Sample,
    Step,
    Timeline,
)

A100 = "NVIDIA-A100-SXM4-40GB"
H100 = "NVIDIA-H100-80GB-HBM3"
TICK = 5.0

MARKS = [
    (5, "quiet", "CalibrationStarted", "re-measuring the crossover: no crossover measured yet"),
    (65, "quiet", "ThresholdChanged", f"{A100}: threshold none -> 36 (crosses at batch 35.3)"),
    (125, "busy", "CalibrationStarted", "re-measuring the crossover: replicas changed from 1 to 2"),
    (185, "busy", "ThresholdChanged", f"{A100}: threshold 36 -> 34 (crosses at batch 34.8)"),
    (240, "busy", "CalibrationStarted", "re-measuring the crossover: traffic shifted by 40%"),
    (290, "busy", "ThresholdKept", f"{A100}: threshold 34 kept (within the damping band)"),
    (
        305,
        "moved",
        "CalibrationStarted",
        f"re-measuring the crossover: GPU SKUs changed from {A100} to {H100}",
    ),
    (365, "moved", "ThresholdChanged", f"{H100}: threshold 34 -> 48 (crosses at batch 48.0)"),
]


def counterfactual(
    threshold: int | None, auto: float, never: float, always: float
) -> Counterfactual:
    """The policies' throughputs as given, over three batches (they need not add up: the
    report and the verdict read the totals)."""
    return Counterfactual(
        threshold=threshold,
        compared=0.9,
        batches=[
            PolicyAtBatch(bucket=24, batch=26, share=0.6, never=never, always=always),
            PolicyAtBatch(bucket=48, batch=50, share=0.38, never=never, always=always),
            PolicyAtBatch(bucket=64, batch=64, share=0.02, never=never, always=always),
        ],
        gpu_tokens_per_s={"auto": auto, "never": never, "always": always},
    )


def phases() -> list[PhaseResult]:
    return [
        PhaseResult(
            name="quiet",
            title="quiet: 8 clients, 1 pod",
            started=0,
            ended=120,
            sku=A100,
            replicas=1,
            clients=[8],
            temperature=0.7,
            threshold=36,
            crossover=35.3,
            crossover_reason="crosses at batch 35.3",
            mean_batch=7.5,
            peak_batch=8.0,
            overrun_percent=0.0,
            goodput_rps=1.5,
            counterfactual=counterfactual(36, 900.0, 700.0, 900.0),
        ),
        PhaseResult(
            name="busy",
            title="busy: 128 clients, 2 pods",
            started=120,
            ended=300,
            sku=A100,
            replicas=2,
            clients=[64, 128, 192],
            temperature=0.7,
            threshold=34,
            crossover=34.8,
            crossover_reason="crosses at batch 34.8",
            mean_batch=33.1,
            peak_batch=58.2,
            overrun_percent=3.4,
            goodput_rps=6.2,
            counterfactual=counterfactual(34, 3100.0, 3040.0, 2400.0),
        ),
        PhaseResult(
            name="moved",
            title="moved to H100",
            started=300,
            ended=480,
            sku=H100,
            replicas=2,
            clients=[64, 128, 192],
            temperature=0.7,
            threshold=48,
            crossover=48.0,
            crossover_reason="crosses at batch 48.0",
            mean_batch=40.3,
            peak_batch=60.1,
            overrun_percent=12.5,
            goodput_rps=8.4,
            counterfactual=counterfactual(48, 4200.0, 4250.0, 3900.0),
        ),
    ]


def _state_at(t: float) -> tuple[int | None, float | None]:
    """The threshold and the crossover the samples read at `t`, following the marks."""
    for since, threshold, crossover in ((365, 48, 48.0), (185, 34, 34.8), (65, 36, 35.3)):
        if t >= since:
            return threshold, crossover
    return None, None


def samples(result: list[PhaseResult]) -> list[Sample]:
    out = []
    t = TICK
    for p in result:
        while t <= p.ended:
            threshold, crossover = _state_at(t)
            event = [f"{r}: {m}" for at, _, r, m in MARKS if at <= t][-1:] or [None]
            out.append(
                Sample(
                    t=t,
                    phase=p.name,
                    clients=p.clients[int(t) % len(p.clients)],
                    replicas=p.replicas,
                    batch={p.sku: p.peak_batch - (t % 3)},
                    threshold=threshold,
                    crossover={p.sku: crossover if p.sku == A100 or t >= 365 else None},
                    goodput_rps=p.goodput_rps,
                    requests=int(p.goodput_rps * TICK),
                    event=event[0],
                )
            )
            t += TICK
    return out


def timeline() -> Timeline:
    """The three-phase demo, simulated 20x slower."""
    result = phases()
    return Timeline(
        started_at="2026-12-01T10:00:00Z",
        time_scale=20,
        simulated=True,
        cold_steps=[
            Step(name="cluster binaries", seconds=12.0),
            Step(name="engine image", seconds=3.5),
            Step(name="simulated models", seconds=95.0),
        ],
        phases=result,
        samples=samples(result),
        marks=[Mark(t=t, phase=p, reason=r, message=m) for t, p, r, m in MARKS],
        total_seconds=611.0,
    )


def mark(t: float, reason: str, message: str = "", phase: str = "busy") -> Mark:
    """A mark for a hand-made sequence; the message defaults to one naming its time."""
    return Mark(t=t, phase=phase, reason=reason, message=message or f"{reason} at {t:g}")
