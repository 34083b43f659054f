"""Prometheus collectors for the metric contract, fed by iteration records and finished
requests. One registry per server, so tests can run several servers in one process."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from spectune.engine import contract as c
from spectune.engine.engine import Iteration
from spectune.engine.request_timing import RequestTiming

disable_created_metrics()  # the *_created series only double the scrape size


def _name(metric: str) -> str:
    """prometheus_client appends _total to counters itself."""
    return metric.removesuffix("_total")


def _labels(metric: str) -> list[str]:
    return list(c.METRIC_LABELS[metric])


class EngineMetrics:
    def __init__(self, info: dict[str, str]) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            _name(c.REQUESTS), "Finished requests by outcome", _labels(c.REQUESTS), registry=r
        )
        self.slo_met = Counter(
            _name(c.REQUESTS_SLO_MET), "Requests within TTFT and TPOT targets", registry=r
        )
        self.prompt_tokens = Counter(
            _name(c.PROMPT_TOKENS), "Prompt tokens of requests answered in full", registry=r
        )
        self.ttft = Histogram(
            c.TIME_TO_FIRST_TOKEN, "Time to first token", buckets=c.LATENCY_BUCKETS, registry=r
        )
        self.itl = Histogram(
            c.INTER_TOKEN_LATENCY, "Inter-token latency", buckets=c.LATENCY_BUCKETS, registry=r
        )
        self.e2e = Histogram(
            c.E2E_REQUEST_LATENCY, "End-to-end latency", buckets=c.LATENCY_BUCKETS, registry=r
        )
        self.running = Gauge(c.NUM_REQUESTS_RUNNING, "Sequences in the running batch", registry=r)
        self.waiting = Gauge(c.NUM_REQUESTS_WAITING, "Requests queued for admission", registry=r)
        self.kv_usage = Gauge(
            c.KV_CACHE_USAGE, "KV blocks in use / total (target+draft)", registry=r
        )
        self.admitted = Gauge(
            c.ADMITTED_CONCURRENCY, "Full-context sequences that fit in KV", registry=r
        )
        self.step_seconds = Histogram(
            c.STEP_SECONDS,
            "Wall time of one decode iteration",
            _labels(c.STEP_SECONDS),
            buckets=c.STEP_BUCKETS,
            registry=r,
        )
        self.step_tokens = Counter(
            _name(c.STEP_OUTPUT_TOKENS),
            "Tokens committed by decode iterations",
            _labels(c.STEP_OUTPUT_TOKENS),
            registry=r,
        )
        self.draft_seconds = Counter(
            _name(c.DRAFT_SECONDS), "Time spent drafting", _labels(c.DRAFT_SECONDS), registry=r
        )
        self.prefill_seconds = Counter(
            _name(c.DRAFT_PREFILL_SECONDS),
            "Time the draft spent on its prefill (also in spec step seconds)",
            _labels(c.DRAFT_PREFILL_SECONDS),
            registry=r,
        )
        self.catchup_seconds = Counter(
            _name(c.DRAFT_CATCHUP_SECONDS),
            "Time the draft spent reading tokens plain iterations committed",
            _labels(c.DRAFT_CATCHUP_SECONDS),
            registry=r,
        )
        self.iterations = Counter(
            _name(c.ITERATIONS),
            "Decode iterations by mode, and whether the mode was explored",
            _labels(c.ITERATIONS),
            registry=r,
        )
        self.iteration_failures = Counter(
            _name(c.ITERATION_FAILURES), "Iterations that raised (their requests failed)",
            registry=r,
        )  # fmt: skip
        self.startup_seconds = Gauge(
            c.STARTUP_SECONDS, "Seconds from the server's start to Ready", registry=r
        )
        self.fixed_shapes = Gauge(
            c.FIXED_SHAPES, "Fixed shapes built (CUDA graphs on CUDA), warm-up included", registry=r
        )
        self.drafts = Counter(_name(c.SPEC_DRAFTS), "Sequences drafted for", registry=r)
        self.draft_tokens = Counter(_name(c.SPEC_DRAFT_TOKENS), "Drafted tokens", registry=r)
        self.accepted = Counter(
            _name(c.SPEC_ACCEPTED_TOKENS), "Accepted drafted tokens", registry=r
        )
        self.threshold = Gauge(
            c.SPEC_THRESHOLD, "Batch size at/above which speculation is off", registry=r
        )
        self.exploration = Gauge(
            c.SPEC_EXPLORATION_RATIO, "Share of iterations in the other mode", registry=r
        )
        self.overruns = Counter(
            _name(c.SIMULATED_OVERRUNS),
            "Simulated-SKU iterations whose real time exceeded their modelled time",
            registry=r,
        )
        self._overruns_seen = 0
        Gauge(c.ENGINE_INFO, "Engine identity", list(info), registry=r).labels(**info).set(1)
        for outcome in c.OUTCOMES:
            self.requests.labels(outcome)

    def observe_iteration(self, it: Iteration) -> None:
        if it.mode == "prefill":
            return
        batch = str(c.batch_bucket(it.batch_size))
        self.step_seconds.labels(it.mode, batch).observe(it.seconds)
        self.step_tokens.labels(it.mode, batch).inc(it.tokens)
        self.iterations.labels(it.mode, "true" if it.explored else "false").inc()
        if it.mode == "spec":
            self.draft_seconds.labels(batch).inc(it.draft_seconds)
            self.prefill_seconds.labels(batch).inc(it.draft_prefill_seconds)
            self.catchup_seconds.labels(batch).inc(it.catchup_seconds)
            self.drafts.inc(it.drafts)
            self.draft_tokens.inc(it.drafted)
            self.accepted.inc(it.accepted)

    def observe_request(
        self, timing: RequestTiming | None, outcome: str, slo_met: bool, prompt_tokens: int = 0
    ) -> None:
        self.requests.labels(outcome).inc()
        if outcome == "ok":
            self.prompt_tokens.inc(prompt_tokens)
        if timing is None:
            return
        self.ttft.observe(timing.ttft)
        self.e2e.observe(timing.e2e)
        if slo_met:
            self.slo_met.inc()

    def observe_tokens(self, seconds: float, count: int) -> None:
        """`count` tokens arrived together after `seconds`: each is charged an equal share."""
        for _ in range(count):
            self.itl.observe(seconds / count)

    def set_state(self, running: int, waiting: int, kv_usage: float, admitted: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(kv_usage)
        self.admitted.set(admitted)

    def count_overruns(self, total: int) -> None:
        """The simulated device keeps the running total; the counter follows it."""
        self.overruns.inc(total - self._overruns_seen)
        self._overruns_seen = total

    def set_speculation(self, threshold: int | None, exploration: float) -> None:
        self.threshold.set(math.inf if threshold is None else threshold)
        self.exploration.set(exploration)
