"""Prometheus as the operator sees it, in virtual time: each pod's series sampled once per scrape
interval (at a per-pod offset, as Prometheus spreads its targets), and the reader's queries
answered from those samples with PromQL's semantics: `increase()` over the samples in the
window, extrapolated to its edges as Prometheus extrapolates; `avg_over_time()`; an engine
counted only while its info series is fresh and was there `warm_up` seconds ago. A pod not yet
scraped has no series; a deleted pod's series end. Samples older than any window are dropped.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from spectune.engine import contract as c
from spectune.operator.observations import EngineInfo, FleetWindow
from spectune.operator.window import (
    BATCH_FIGURES,
    E2E_QUANTILE,
    FIGURES,
    MIN_BATCHES,
    SKU,
    Figure,
    bucket_quantile,
    fleet_window,
    freshness,
)
from spectune.sim.engine_pod import Labels, SeriesKey

# What the reader's queries touch: everything else a pod exposes is not sampled.
QUERIED = frozenset(
    {
        f"{c.STEP_SECONDS}_count", f"{c.STEP_SECONDS}_sum", c.STEP_OUTPUT_TOKENS,
        c.DRAFT_PREFILL_SECONDS, c.REQUESTS,
        c.REQUESTS_SLO_MET, c.PROMPT_TOKENS, c.SPEC_DRAFT_TOKENS, c.SPEC_ACCEPTED_TOKENS,
        c.NUM_REQUESTS_RUNNING, c.NUM_REQUESTS_WAITING, c.ADMITTED_CONCURRENCY,
        f"{c.E2E_REQUEST_LATENCY}_bucket",
        f"{c.INTER_TOKEN_LATENCY}_sum", f"{c.INTER_TOKEN_LATENCY}_count", c.ENGINE_INFO,
    }
)  # fmt: skip
QUERIES_PER_READ = 5  # the real reader's: clock, scrape interval, engines, figures, batches
KEEP_SECONDS = 1800.0


@dataclass
class Target:
    """One pod as a scrape target: its samples, oldest first."""

    pod: str
    samples: deque[tuple[float, dict[SeriesKey, float]]] = field(default_factory=deque)
    gone_at: float | None = None  # deleted: no instant query sees it after this


def increase(points: list[tuple[float, float]], start: float, end: float) -> float | None:
    """PromQL's increase() over (start, end] from a counter's samples in it: the change
    between the first and last sample, extrapolated to the window's edges (up to half a
    sample interval past a sample where the series starts or ends, and never below zero)."""
    if len(points) < 2:
        return None
    (t0, v0), (t1, v1) = points[0], points[-1]
    result = v1 - v0
    sampled = t1 - t0
    average = sampled / (len(points) - 1)
    to_start, to_end = t0 - start, end - t1
    threshold = average * 1.1
    if to_start >= threshold:
        to_start = average / 2
    if to_end >= threshold:
        to_end = average / 2
    if result > 0 and v0 >= 0:
        to_zero = sampled * v0 / result
        to_start = min(to_start, to_zero)
    return result * (sampled + to_start + to_end) / sampled


class Scrapes:
    """The samples of every target, and the reader's queries over them."""

    def __init__(self, interval: float, stale_after: float = 30.0, warm_up: float = 15.0) -> None:
        self.interval = interval
        self.stale_after = stale_after
        self.warm_up = warm_up
        self.targets: dict[str, Target] = {}
        self.queries = 0

    def scrape(self, pod: str, now: float, values: Mapping[SeriesKey, float]) -> None:
        target = self.targets.setdefault(pod, Target(pod))
        target.samples.append((now, {k: v for k, v in values.items() if k[0] in QUERIED}))
        while target.samples and target.samples[0][0] < now - KEEP_SECONDS:
            target.samples.popleft()

    def remove(self, pod: str, now: float) -> None:
        if pod in self.targets:
            self.targets[pod].gone_at = now

    def forget(self, before: float) -> None:
        """Targets gone long enough that no window reaches them."""
        for pod in [p for p, t in self.targets.items() if t.gone_at and t.gone_at < before]:
            del self.targets[pod]

    def engines(self, now: float) -> dict[str, EngineInfo]:
        """The reader's `engines`: scraped within the staleness, and up the warm-up ago, each
        stretched to the scrape interval as the reader stretches them."""
        stale, warm_up = freshness(self.stale_after, self.warm_up, self.interval)
        found = {}
        for pod, target in self.targets.items():
            if not target.samples or (target.gone_at is not None and target.gone_at <= now):
                continue
            first, (last, values) = target.samples[0][0], target.samples[-1]
            if now - last > stale or first > now - warm_up:
                continue
            info = next(dict(k[1]) for k in values if k[0] == c.ENGINE_INFO)
            found[pod] = EngineInfo(
                pod=pod,
                device=info["device"],
                model=info["model"],
                draft=info["draft"],
                version=info["version"],
                simulated=True,
                age_seconds=now - last,
            )
        return found

    def read(self, now: float, window_seconds: int) -> FleetWindow:
        """What PrometheusReader.read returns at `now` over the last `window_seconds`."""
        self.queries += QUERIES_PER_READ
        pods = self.engines(now)
        start = now - window_seconds

        # pod -> metric -> labels -> points in (start, now], in one pass over the samples
        index: dict[str, dict[str, dict[Labels, list[tuple[float, float]]]]] = {}
        for pod in pods:
            by_metric = index.setdefault(pod, {})
            for t, values in self.targets[pod].samples:
                if start < t <= now:
                    for (name, lab), v in values.items():
                        by_metric.setdefault(name, {}).setdefault(lab, []).append((t, v))

        def answer(figure: Figure) -> dict[tuple[str, ...], float]:
            """As PromQL aggregates it: per pod first (its series summed within each group),
            then over pods."""
            per_pod: dict[tuple[str, ...], list[float]] = {}
            by_le: dict[str, float] = {}
            for pod, by_metric in index.items():
                mine: dict[tuple[str, ...], float] = {}
                for lab, points in by_metric.get(figure.metric, {}).items():
                    d = {**dict(lab), SKU: pods[pod].device}
                    if figure.kind in ("mean", "total"):
                        value: float | None = sum(v for _, v in points) / len(points)
                    else:
                        value = increase(points, start, now)
                    if value is None:
                        continue
                    if figure.kind == "p95":
                        by_le[d["le"]] = by_le.get(d["le"], 0.0) + value
                    key = tuple(d.get(label, "") for label in figure.by)
                    mine[key] = mine.get(key, 0.0) + value
                for key, value in mine.items():
                    per_pod.setdefault(key, []).append(value)
            if figure.kind == "p95":
                p95 = bucket_quantile(E2E_QUANTILE, by_le)
                return {} if p95 is None else {(): p95}
            if figure.kind == "mean":
                return {k: sum(v) / len(v) for k, v in per_pod.items()}
            return {k: sum(v) for k, v in per_pod.items()}

        answers = {name: found for name, f in FIGURES.items() if (found := answer(f))}
        batches = self.batches(pods, now, window_seconds)
        return fleet_window(pods, window_seconds, answers, self.interval, batches)

    def batches(
        self, pods: Mapping[str, EngineInfo], now: float, window_seconds: int
    ) -> dict[tuple[str, str, str], list[tuple[float, float]]]:
        """The reader's `batches`: at every interval back from `now`, each counter's last
        sample then less its last sample an interval before, summed by SKU, mode and bucket."""
        count = int(window_seconds // self.interval)
        if count < MIN_BATCHES:
            return {}
        metrics = [f.metric for f in BATCH_FIGURES.values()]
        out: dict[tuple[str, str, str], dict[float, list[float]]] = {}
        for pod, info in pods.items():
            samples = self.targets[pod].samples
            stamps = [t for t, _ in samples]
            for at in (now - k * self.interval for k in range(count)):
                last = bisect.bisect_right(stamps, at) - 1
                before = bisect.bisect_right(stamps, at - self.interval) - 1
                if before < 0 or last == before:
                    continue
                new, old = samples[last][1], samples[before][1]
                for key, value in new.items():
                    if key[0] not in metrics or (was := old.get(key)) is None or value < was:
                        continue
                    labels = dict(key[1])
                    sums = out.setdefault((info.device, labels["mode"], labels["batch"]), {})
                    sums.setdefault(at, [0.0, 0.0])[metrics.index(key[0])] += value - was
        return {k: [(t, s) for t, s in by_time.values()] for k, by_time in out.items()}
