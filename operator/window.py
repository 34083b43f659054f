"""A FleetWindow from the figures one read asks for: each an aggregate over the fresh, warm
engines and the window (a counter's increase summed, a gauge's mean averaged or summed, a
histogram's 95th percentile), grouped by a few labels, the SKU among them. The Prometheus reader
asks them of Prometheus in one PromQL query, aggregated there; the fleet simulator answers them
from the samples its scrapes took. Either way this module turns the answers into the steps per
SKU and the traffic the state machine decides on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from spectune.engine import contract as c
from spectune.engine.crossover import ModeStats, StatsByBucket
from spectune.operator.observations import EngineInfo, FleetWindow, Traffic

SKU = "device"  # grouping by it: by the `device` label of each pod's spectune_engine_info
E2E_QUANTILE = 0.95

# figure -> (values of its grouping labels) -> value over the fresh engines
Answers = Mapping[str, Mapping[tuple[str, ...], float]]
# (SKU, mode, bucket) -> (tokens, seconds) of each batch of the window: one scrape interval of
# the SKU's fresh engines
Batches = Mapping[tuple[str, str, str], Sequence[tuple[float, float]]]
# Batches for a measured noise: fewer say little of the spread.
MIN_BATCHES = 4


@dataclass(frozen=True)
class Figure:
    """One aggregate over the window and the fresh engines. `increase`: a counter's increase,
    summed over pods; `mean`, `total`: a gauge's mean over the window, averaged or summed over
    pods; `p95`: the 95th percentile of a histogram (`metric` its `_bucket` series) summed over
    pods. Each pod counts once whoever scraped it (two jobs scraping a pod give it twice)."""

    kind: Literal["increase", "mean", "total", "p95"]
    metric: str
    by: tuple[str, ...] = ()


BY_STEP = (SKU, "mode", "batch")
FIGURES: Mapping[str, Figure] = {
    "steps": Figure("increase", f"{c.STEP_SECONDS}_count", BY_STEP),
    "step_seconds": Figure("increase", f"{c.STEP_SECONDS}_sum", BY_STEP),
    "step_tokens": Figure("increase", c.STEP_OUTPUT_TOKENS, BY_STEP),
    "prefill_seconds": Figure("increase", c.DRAFT_PREFILL_SECONDS, (SKU, "batch")),
    "requests": Figure("increase", c.REQUESTS, ("outcome",)),
    "slo_met": Figure("increase", c.REQUESTS_SLO_MET),
    "prompt_tokens": Figure("increase", c.PROMPT_TOKENS),
    "drafted_tokens": Figure("increase", c.SPEC_DRAFT_TOKENS),
    "accepted_tokens": Figure("increase", c.SPEC_ACCEPTED_TOKENS),
    "inter_token_seconds": Figure("increase", f"{c.INTER_TOKEN_LATENCY}_sum"),
    "inter_tokens": Figure("increase", f"{c.INTER_TOKEN_LATENCY}_count"),
    "running": Figure("mean", c.NUM_REQUESTS_RUNNING),
    "waiting": Figure("total", c.NUM_REQUESTS_WAITING),
    "admitted": Figure("total", c.ADMITTED_CONCURRENCY),
    "e2e_p95": Figure("p95", f"{c.E2E_REQUEST_LATENCY}_bucket"),
}
# What each batch holds: the increase of these per scrape interval, not over the window.
BATCH_FIGURES: Mapping[str, Figure] = {
    "batch_tokens": Figure("increase", c.STEP_OUTPUT_TOKENS, BY_STEP),
    "batch_seconds": Figure("increase", f"{c.STEP_SECONDS}_sum", BY_STEP),
}


def freshness(stale_after: float, warm_up: float, interval: float | None) -> tuple[float, float]:
    """How old an engine's info series may be and how long it must have been there for the
    engine to count, stretched to the scrape `interval` (None: not seen yet) where it is longer
    than they allow: a fresh series is up to an interval old (three leave room for a late
    scrape), and a counter needs two samples to increase. A warm-up of 0 stays 0 (no warm-up)."""
    if not interval:
        return stale_after, warm_up
    return max(stale_after, 3 * interval), max(warm_up, 2 * interval) if warm_up else 0.0


def fleet_window(
    pods: Mapping[str, EngineInfo],
    window_seconds: float,
    answers: Answers,
    scrape_interval: float | None = None,
    batches: Batches | None = None,
) -> FleetWindow:
    """Step sums per (SKU, mode, bucket) and traffic over the window from the `answers` to
    FIGURES, and the throughput's noise from the window's `batches`, asked over `pods` (the
    fresh, warm engines) only. A figure without an answer is unknown (None), never zero; a
    non-finite sample (NaN, +/-Inf: a histogram without observations, a division in a
    recording rule) is a missing one."""
    answers = {
        name: {key: v for key, v in values.items() if math.isfinite(v)}
        for name, values in answers.items()
    }
    batches = {
        key: [(t, s) for t, s in runs if math.isfinite(t) and math.isfinite(s)]
        for key, runs in (batches or {}).items()
    }

    def total(figure: str) -> float | None:
        values = answers.get(figure, {}).values()
        return sum(values) if values else None

    def one(figure: str, *key: str) -> float | None:
        return answers.get(figure, {}).get(key)

    steps: dict[str, StatsByBucket] = {}
    seconds, tokens = answers.get("step_seconds", {}), answers.get("step_tokens", {})
    prefill = answers.get("prefill_seconds", {})
    for (sku, mode, batch), n in answers.get("steps", {}).items():
        if mode not in c.MODES or not batch.isdigit():
            continue
        spent = seconds.get((sku, mode, batch), 0.0)
        if mode == "spec":
            plain = tokens.get((sku, "plain", batch), 0.0)
            spec = tokens.get((sku, "spec", batch), 0.0)
            spent -= steady_prefill_excess(prefill.get((sku, batch), 0.0), spec, plain)
        stats = ModeStats(round(n), round(tokens.get((sku, mode, batch), 0.0)), spent)
        if stats.steps > 0:
            steps.setdefault(sku, {})[(mode, int(batch))] = stats

    traffic = Traffic(
        seconds=float(window_seconds),
        requests=total("requests"),
        slo_met=total("slo_met"),
        ok_requests=one("requests", "ok"),
        rejected_requests=one("requests", "rejected"),
        prompt_tokens=total("prompt_tokens"),
        decode_tokens=total("step_tokens"),
        drafted_tokens=total("drafted_tokens"),
        accepted_tokens=total("accepted_tokens"),
        mean_running=one("running"),
        mean_waiting=one("waiting"),
        admitted_concurrency=one("admitted"),
        e2e_p95_seconds=one("e2e_p95"),
        inter_token_seconds=total("inter_token_seconds"),
        inter_tokens=total("inter_tokens"),
        engines=float(len(pods)) if pods else None,
    )
    noise: dict[str, dict[tuple[str, int], float]] = {}
    for (sku, mode, batch), per_batch in batches.items():
        if mode in c.MODES and batch.isdigit() and (se := throughput_noise(per_batch)) is not None:
            noise.setdefault(sku, {})[(mode, int(batch))] = se
    return FleetWindow(
        engines=pods, steps=steps, traffic=traffic, scrape_interval=scrape_interval, noise=noise
    )


def throughput_noise(batches: Sequence[tuple[float, float]]) -> float | None:
    """The relative standard error of a throughput summed over batches of (tokens, seconds),
    from how the batches' throughputs spread about it (batch means: the ratio estimator's
    variance, each batch weighing by its seconds). A batch is one scrape interval of a SKU's
    engines, so steps that ran together (one batch mix, one machine's hiccup) count as one
    observation, not many: the steps' own count overstates what the mean knows. None with
    fewer than MIN_BATCHES batches that ran."""
    ran = [(t, s) for t, s in batches if s > 0]
    tokens = sum(t for t, _ in ran)
    if len(ran) < MIN_BATCHES or tokens <= 0:
        return None
    n, rate = len(ran), tokens / sum(s for _, s in ran)
    residuals = sum((t - rate * s) ** 2 for t, s in ran)
    return math.sqrt(n / (n - 1) * residuals) / tokens


def steady_prefill_excess(prefill: float, spec_tokens: float, plain_tokens: float) -> float:
    """Seconds of the draft's prefill that spec steps carry beyond what they would when
    speculating steadily. Every speculating request pays its draft prefill once, at its
    first spec step; speculating at every step, that cost spreads over all of a bucket's
    tokens. While exploring, spec steps produce only a share of the tokens yet meet every
    request's first spec step, so they carry the prefill of the tokens the plain steps made
    too: at calibration's even split, twice the steady share, which made the crossover of long
    prompts read ~20% low (spectune-sim). What is excess: the plain tokens' share of it, taken
    over a SKU's engines together (they explore at one share)."""
    total = spec_tokens + plain_tokens
    return prefill * plain_tokens / total if total > 0 else 0.0


def bucket_quantile(q: float, buckets: Mapping[str, float]) -> float | None:
    """The q-quantile of a histogram from its cumulative bucket counts by `le` bound, as
    PromQL's histogram_quantile interpolates it (linearly within the bucket it falls in; the
    +Inf bucket gives the largest finite bound). None without observations."""
    ordered = sorted((float(le), n) for le, n in buckets.items())
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return lower
