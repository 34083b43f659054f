"""Each policy's decode throughput on a phase's traffic: per batch bucket, what the phase's
engines measured for each mode there (their exploration interleaves the two modes on the same
requests at the same batch sizes), on the simulated GPU's clock, weighted by the share of
decode time the engines spent in that bucket.

Why not replay the traffic under each policy: closed-loop clients replayed one policy at a time
do not make the same batches. On this CPU plain requests stay in lockstep while speculative
ones drift apart, so never-speculating ran at batch 62 where always-speculating ran at 48 under
the same 64 clients, and the comparison measured the batches, not the policies. Nor the device
model at the phase's mean drafted tokens: n-gram drafts come in bursts, and a verify forward
costs max(memory, compute), so the mean understates speculation's cost near the crossover
(docs/PERFORMANCE.md). Pure, so it is tested without a cluster."""

from __future__ import annotations

from spectune.demo.timeline import Counterfactual, PolicyAtBatch
from spectune.engine.bench.loadgen import Counters
from spectune.engine.crossover import ModeStats
from spectune.operator.estimator import MIN_STEPS


def speculates(threshold: int | None, batch: int) -> bool:
    """The engines' gate: speculate while the batch is below the threshold (None: always)."""
    return threshold is None or batch < threshold


def policies_on_batches(
    counters: Counters, threshold: int | None, time_scale: float, min_steps: int = MIN_STEPS
) -> Counterfactual | None:
    """The three policies (auto runs `threshold`) on what one phase's engines ran (`counters`,
    summed over them), over the buckets where both modes ran at least `min_steps` steps (the
    operator's own minimum): each bucket's tokens per second per mode, on the GPU's clock
    (the engines' is `time_scale` slower), at the mean batch of its plain steps (a plain step
    commits one token per sequence), weighted by its share of those buckets' decode time.
    None when no bucket was measured in both modes."""
    steps = {key: s for key, s in counters.steps.items() if s.steps > 0}
    spent = sum(s.seconds for s in steps.values())
    rows = []
    for bucket in sorted({b for _, b in steps}):
        plain, spec = steps.get(("plain", bucket), ModeStats()), steps.get(("spec", bucket))
        if spec is None or min(plain.steps, spec.steps) < min_steps:
            continue
        if not (plain.throughput and spec.throughput):  # no time on the clock: unmeasured
            continue
        rows.append(
            PolicyAtBatch(
                bucket=bucket,
                batch=round(plain.tokens / plain.steps),
                share=plain.seconds + spec.seconds,  # normalised below
                never=plain.throughput * time_scale,
                always=spec.throughput * time_scale,
            )
        )
    compared = sum(r.share for r in rows)
    if not rows or not compared:
        return None
    rows = [r.model_copy(update={"share": r.share / compared}) for r in rows]
    auto = sum(r.share * (r.always if speculates(threshold, r.batch) else r.never) for r in rows)
    return Counterfactual(
        threshold=threshold,
        compared=compared / spent,
        batches=rows,
        gpu_tokens_per_s={
            "auto": auto,
            "never": sum(r.share * r.never for r in rows),
            "always": sum(r.share * r.always for r in rows),
        },
    )
