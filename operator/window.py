"""A FleetWindow from per-pod series: how the reader sums what Prometheus returned, as a pure
function of two queries (an increase over the window, a gauge's mean over it). The Prometheus
reader answers them with PromQL; the fleet simulator answers them from the samples its scrapes
took. Either way the steps are summed per SKU and the traffic over pods alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from spectune.engine import contract as c
from spectune.engine.crossover import ModeStats, StatsByBucket
from spectune.operator.observations import EngineInfo, FleetWindow, Traffic

# (values of the grouping labels) -> pod -> value
PerPod = dict[tuple[str, ...], dict[str, float]]


def freshness(stale_after: float, warm_up: float, interval: float | None) -> tuple[float, float]:
    """How old an engine's info series may be and how long it must have been there for the
    engine to count, stretched to the scrape `interval` (None: not seen yet) where it is longer
    than they allow: a fresh series is up to an interval old (three leave room for a late
    scrape), and a counter needs two samples to increase. A warm-up of 0 stays 0 (no warm-up)."""
    if not interval:
        return stale_after, warm_up
    return max(stale_after, 3 * interval), max(warm_up, 2 * interval) if warm_up else 0.0


class Increase(Protocol):
    """A counter's increase over the window per pod, grouped by the labels `by`, over the
    series whose labels match `labels`."""

    def __call__(self, metric: str, by: tuple[str, ...] = (), **labels: str) -> PerPod: ...


def fleet_window(
    pods: Mapping[str, EngineInfo],
    window_seconds: float,
    increase: Increase,
    mean_gauge: Callable[[str], dict[str, float]],
    scrape_interval: float | None = None,
) -> FleetWindow:
    """Step sums per (SKU, mode, bucket) and traffic over the window, for `pods` only (the
    fresh, warm ones): `increase` and `mean_gauge` return per-pod values."""
    by_step = ("mode", "batch")
    counts = increase(f"{c.STEP_SECONDS}_count", by=by_step)
    seconds = increase(f"{c.STEP_SECONDS}_sum", by=by_step)
    tokens = increase(c.STEP_OUTPUT_TOKENS, by=by_step)
    prefill = increase(c.DRAFT_PREFILL_SECONDS, by=("batch",))
    steps: dict[str, StatsByBucket] = {}
    for (mode, batch), per_pod in counts.items():
        if mode not in c.MODES or not batch.isdigit():
            continue
        for p, n in per_pod.items():
            if p not in pods:
                continue
            spent = seconds.get((mode, batch), {}).get(p, 0.0)
            if mode == "spec":
                plain = tokens.get(("plain", batch), {}).get(p, 0.0)
                spec = tokens.get(("spec", batch), {}).get(p, 0.0)
                spent -= steady_prefill_excess(prefill.get((batch,), {}).get(p, 0.0), spec, plain)
            stats = ModeStats(round(n), round(tokens.get((mode, batch), {}).get(p, 0.0)), spent)
            if stats.steps > 0:
                by_mode = steps.setdefault(pods[p].device, {})
                key = (mode, int(batch))
                by_mode[key] = by_mode.get(key, ModeStats()) + stats

    def total(per: PerPod) -> float | None:
        values = [v for per_pod in per.values() for p, v in per_pod.items() if p in pods]
        return sum(values) if values else None

    def gauge(metric: str) -> list[float]:
        return [v for p, v in mean_gauge(metric).items() if p in pods]

    running = gauge(c.NUM_REQUESTS_RUNNING)
    admitted = gauge(c.ADMITTED_CONCURRENCY)
    e2e = {
        le: sum(v for p, v in per_pod.items() if p in pods)
        for (le,), per_pod in increase(f"{c.E2E_REQUEST_LATENCY}_bucket", by=("le",)).items()
    }
    traffic = Traffic(
        seconds=float(window_seconds),
        requests=total(increase(c.REQUESTS)),
        slo_met=total(increase(c.REQUESTS_SLO_MET)),
        ok_requests=total(increase(c.REQUESTS, outcome="ok")),
        rejected_requests=total(increase(c.REQUESTS, outcome="rejected")),
        prompt_tokens=total(increase(c.PROMPT_TOKENS)),
        decode_tokens=total(tokens),
        drafted_tokens=total(increase(c.SPEC_DRAFT_TOKENS)),
        accepted_tokens=total(increase(c.SPEC_ACCEPTED_TOKENS)),
        mean_running=sum(running) / len(running) if running else None,
        admitted_concurrency=sum(admitted) if admitted else None,
        e2e_p95_seconds=bucket_quantile(0.95, e2e),
        inter_token_seconds=total(increase(f"{c.INTER_TOKEN_LATENCY}_sum")),
        inter_tokens=total(increase(f"{c.INTER_TOKEN_LATENCY}_count")),
        engines=float(len(pods)) if pods else None,
    )
    return FleetWindow(engines=pods, steps=steps, traffic=traffic, scrape_interval=scrape_interval)


def steady_prefill_excess(prefill: float, spec_tokens: float, plain_tokens: float) -> float:
    """Seconds of the draft's prefill that spec steps carry beyond what they would when
    speculating steadily. Every speculating request pays its draft prefill once, at its
    first spec step; speculating at every step, that cost spreads over all of a bucket's
    tokens. While exploring, spec steps produce only a share of the tokens yet meet every
    request's first spec step, so they carry the prefill of the tokens the plain steps made
    too: at calibration's even split, twice the steady share, which made the crossover of long
    prompts read ~20% low (spectune-sim). What is excess: the plain tokens' share of it."""
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
