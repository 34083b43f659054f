"""The operator's read load on a real Prometheus holding a fleet's engine series (issue 33).

A stand-in exporter (a child process serving on 127.0.0.1) stands in for 1000 engine pod
targets: for every (namespace, pod) of 100 SpecDeployments x 10 pods it serves the series a
real engine serves (engine/serving/metrics.py: the contract's names, label sets and histogram
buckets; both modes in every batch bucket up to the engine's default max batch of 64, as a
calibrating engine has them), with `namespace`, `pod` and `container` labels on each, split
over a few targets that the local Prometheus binary scrapes with `honor_labels: true`, so the
series carry the labels the Prometheus Operator would attach. Counters grow with time at
per-pod rates, on three GPU SKUs (every fifth deployment mixes two).

Once the series span the calibration window, every deployment turns once, one after the
other, as the operator's turn does minus the API server: `tuning.observe` with
`PrometheusReader(url).read(Selector(namespace, pod names), window)`, then the pure decision
`tuning.tune` on synthetic ready pods. Then every deployment turns each RESYNC_SECONDS from a
thread pool the size of asyncio.to_thread's default executor (where the operator's turns run),
for a few rounds. Queries are counted on Prometheus's side (its own /metrics), so the figures
follow whatever the reader does. It stops by itself: the run is the warm-up (window plus two
scrape intervals) and the rounds.

    .venv/bin/python benchmarks/prometheus_load.py           # 100 x 10 at 30 s: ~6 min
    .venv/bin/python benchmarks/prometheus_load.py --deployments 10 --scrape-interval 5
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from spectune.engine import contract as c
from spectune.operator import autotune, tuning
from spectune.operator.handlers import EXPLORATION_LEASE_SECONDS, RESYNC_SECONDS
from spectune.operator.models import SpecDeploymentSpec, parse_spec
from spectune.operator.prometheus import PrometheusReader, Selector

REPO = Path(__file__).resolve().parents[1]
PROMETHEUS = REPO / ".local" / "bin" / "prometheus"
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only
# What the operator's turns run on: asyncio.to_thread's default executor, this many threads.
TURN_THREADS = min(32, (os.cpu_count() or 1) + 4)
TARGET_RECONCILE_SECONDS = 1.0
TARGET_QUERIES_PER_SECOND = 1.0  # per deployment, on average
# The reader leaves out engines whose series are younger than its warm-up (15 s at short
# scrape intervals): the warm-up here is never shorter than this.
MIN_WARM_UP_SECONDS = 20.0

# The engines' traffic: the engine's default max batch and speculation settings.
MAX_BATCH = 64
BATCHES = tuple(b for b in c.BATCH_BUCKETS if b <= MAX_BATCH)
K, ACCEPTANCE = 4, 0.35  # drafted tokens per sequence per spec step, and the share accepted
SPEC_OVERHEAD = 1.25  # a spec step's time over a plain one's at batch ~0
EXPLORATION = 0.02  # share of steps in the mode the gate did not pick
OUTPUT_TOKENS, PROMPT_TOKENS = 256, 600  # per request
OUTCOMES = {"ok": 0.95, "error": 0.005, "rejected": 0.025, "invalid": 0.005, "cancelled": 0.015}
SLO_MET = 0.9  # of the ok requests
WOBBLE = 0.1  # gauges swing this share of their level
POD_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # what Kubernetes generates pod name suffixes from
VERSION = version("spectune")  # the engine's version label


@dataclass(frozen=True)
class Sku:
    """A GPU's decode speed: a plain step takes `step_seconds * (1 + batch / knee)`, a spec
    step `SPEC_OVERHEAD + batch / spec_knee` times that, so speculation pays up to a batch near
    1.15 x spec_knee."""

    device: str
    step_seconds: float
    knee: float
    spec_knee: float
    admitted: int  # sequences that fit in its memory

    def plain_seconds(self, batch: int) -> float:
        return self.step_seconds * (1 + batch / self.knee)

    def spec_seconds(self, batch: int) -> float:
        return self.plain_seconds(batch) * (SPEC_OVERHEAD + batch / self.spec_knee)

    @property
    def threshold(self) -> int:
        """The first bucket where speculation no longer pays: what its engines run."""
        tokens = 1 + K * ACCEPTANCE
        return next(
            (b for b in BATCHES if tokens * self.plain_seconds(b) < self.spec_seconds(b)),
            MAX_BATCH,
        )


SKUS = (
    Sku("NVIDIA-H100-80GB-HBM3", 0.010, 96.0, 40.0, 128),
    Sku("NVIDIA-A100-SXM4-40GB", 0.016, 64.0, 24.0, 96),
    Sku("NVIDIA-L4", 0.040, 24.0, 8.0, 24),
)


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    sku: Sku
    load: float  # its mean running batch
    phase: float  # of its gauges' swing


@dataclass(frozen=True)
class Deployment:
    namespace: str
    name: str
    pods: tuple[Pod, ...]

    @property
    def skus(self) -> frozenset[str]:
        return frozenset(p.sku.device for p in self.pods)


def fleet(deployments: int, pods: int) -> list[Deployment]:
    """`deployments` of `pods` engines each, ten to a namespace, on the SKUs in turn; every
    fifth deployment spread over two SKUs. Fixed by a seed: the exporter builds the same."""
    rng = random.Random(33)

    def suffix(length: int) -> str:
        return "".join(rng.choices(POD_CHARS, k=length))

    out = []
    for i in range(deployments):
        name, namespace = f"llm-{i:03d}", f"team-{i // 10:02d}"
        skus = (SKUS[i % 3],) if i % 5 else (SKUS[i % 3], SKUS[(i + 1) % 3])
        template = suffix(10)  # its ReplicaSet's hash
        members = tuple(
            Pod(namespace, f"{name}-{template}-{suffix(5)}", skus[j % len(skus)],
                load=rng.uniform(3.0, 40.0), phase=rng.uniform(0.0, 2 * math.pi))
            for j in range(pods)
        )  # fmt: skip
        out.append(Deployment(namespace, name, members))
    return out


# How a series' value follows the seconds t since the exporter started (a, b: its numbers)
COUNT, SCALED, SWING, CONSTANT = range(4)
# COUNT: int(int(a t) * b): events at a per second (b = 1), or a histogram bucket's share b
# SCALED: int(a t) * b: a sum over those events, b each; SWING: a * (1 + WOBBLE sin(t/60 + b))
# CONSTANT: a, already formatted


class Page:
    """One target's exposition: families in the engine's order, each pod's series in each."""

    def __init__(self) -> None:
        self.families: dict[str, tuple[str, list[tuple[str, int, Any, float]]]] = {}

    def add(self, family: str, kind: str, series: str, how: int, a: Any, b: float = 1.0) -> None:
        header = f"# HELP {family} spectune engine\n# TYPE {family} {kind}\n"
        self.families.setdefault(family, (header, []))[1].append((series, how, a, b))

    def histogram(self, name: str, labels: str, rate: float, seconds: float, spread: float,
                  bounds: Sequence[float]) -> None:  # fmt: skip
        """`rate` observations a second, log-normal about `seconds`."""
        for le in (*bounds, math.inf):
            share = 0.5 * (1 + math.erf(math.log(le / seconds) / (spread * math.sqrt(2))))
            bucket = f'{name}_bucket{{{labels},le="{floatToGoString(le)}"}}'
            self.add(name, "histogram", bucket, COUNT, rate, share)
        self.add(name, "histogram", f"{name}_count{{{labels}}}", COUNT, rate)
        mean = seconds * math.exp(spread**2 / 2)
        self.add(name, "histogram", f"{name}_sum{{{labels}}}", SCALED, rate, mean)

    def render(self, t: float) -> bytes:
        lines = []
        for header, series in self.families.values():
            lines.append(header)
            for name, how, a, b in series:
                if how == COUNT:
                    value: Any = int(int(a * t) * b)
                elif how == SCALED:
                    value = int(a * t) * b
                elif how == SWING:
                    value = a * (1 + WOBBLE * math.sin(t / 60 + b))
                else:
                    value = a
                lines.append(f"{name} {value}\n")
        return "".join(lines).encode()


def engine_series(page: Page, pod: Pod) -> None:
    """What the engine on `pod` serves: calibrating, it runs both modes at every bucket, most
    steps in the mode its SKU's threshold picks, the time spread about its mean batch."""
    sku, base = pod.sku, f'namespace="{pod.namespace}",pod="{pod.name}",container="engine"'

    def labels(**own: object) -> str:
        return ",".join([*(f'{k}="{v}"' for k, v in own.items()), base])

    def counter(metric: str, own: str, how: int, a: Any, b: float = 1.0) -> None:
        page.add(metric, "counter", f"{metric}{{{own}}}", how, a, b)

    def gauge(metric: str, how: int, a: Any, b: float = 1.0) -> None:
        page.add(metric, "gauge", f"{metric}{{{base}}}", how, a, b)

    weights = {b: math.exp(-(math.log(b / pod.load) ** 2) / 2) for b in BATCHES}
    weights = {b: w / sum(weights.values()) for b, w in weights.items()}
    steps: dict[tuple[str, int], tuple[float, float]] = {}  # -> (steps a second, seconds each)
    for b in BATCHES:
        spec = 1 - EXPLORATION if b < sku.threshold else EXPLORATION
        steps["spec", b] = weights[b] * spec / sku.spec_seconds(b), sku.spec_seconds(b)
        steps["plain", b] = weights[b] * (1 - spec) / sku.plain_seconds(b), sku.plain_seconds(b)
    per_step = {(m, b): b * (1 + K * ACCEPTANCE if m == "spec" else 1) for m, b in steps}
    tokens = sum(rate * per_step[key] for key, (rate, _) in steps.items())
    drafts = sum(rate * b for (m, b), (rate, _) in steps.items() if m == "spec")
    requests = tokens / OUTPUT_TOKENS
    ok = requests * OUTCOMES["ok"]
    token_seconds, ttft = sku.plain_seconds(round(pod.load)), 0.2 * (1 + pod.load / 32)
    running = min(pod.load, sku.admitted)

    for outcome, share in OUTCOMES.items():
        counter(c.REQUESTS, labels(outcome=outcome), COUNT, requests * share)
    counter(c.REQUESTS_SLO_MET, base, COUNT, ok * SLO_MET)
    counter(c.PROMPT_TOKENS, base, COUNT, ok, PROMPT_TOKENS)
    page.histogram(c.TIME_TO_FIRST_TOKEN, base, ok, ttft, 0.5, c.LATENCY_BUCKETS)
    page.histogram(c.INTER_TOKEN_LATENCY, base, tokens, token_seconds, 0.3, c.LATENCY_BUCKETS)
    e2e = ttft + OUTPUT_TOKENS * token_seconds
    page.histogram(c.E2E_REQUEST_LATENCY, base, ok, e2e, 0.4, c.LATENCY_BUCKETS)
    gauge(c.NUM_REQUESTS_RUNNING, SWING, running, pod.phase)
    gauge(c.NUM_REQUESTS_WAITING, SWING, running / 20, pod.phase)
    gauge(c.KV_CACHE_USAGE, SWING, min(0.95, running / sku.admitted), pod.phase)
    gauge(c.ADMITTED_CONCURRENCY, CONSTANT, f"{sku.admitted}.0")
    gauge(c.STARTUP_SECONDS, CONSTANT, "42.0")
    gauge(c.FIXED_SHAPES, CONSTANT, "0.0")  # a CPU engine's: nothing built ahead
    for (mode, b), (rate, seconds) in steps.items():
        own = labels(mode=mode, batch=b)
        page.histogram(c.STEP_SECONDS, own, rate, seconds, 0.2, c.STEP_BUCKETS)
    for (mode, b), (rate, _) in steps.items():
        counter(c.STEP_OUTPUT_TOKENS, labels(mode=mode, batch=b), COUNT, rate, per_step[mode, b])
    # shares of a spec step's time: drafting, the draft's prefill, its catch-up
    for metric, share in (
        (c.DRAFT_SECONDS, 0.3), (c.DRAFT_PREFILL_SECONDS, 0.04), (c.DRAFT_CATCHUP_SECONDS, 0.01)
    ):  # fmt: skip
        for b in BATCHES:
            rate, seconds = steps["spec", b]
            counter(metric, labels(batch=b), SCALED, rate, seconds * share)
    for mode in c.MODES:
        for explored in (False, True):
            # explored: spec at or above the threshold, plain below it
            rate = sum(
                r
                for (m, b), (r, _) in steps.items()
                if m == mode and explored == ((m == "spec") == (b >= sku.threshold))
            )
            own = labels(mode=mode, explored=str(explored).lower())
            counter(c.ITERATIONS, own, COUNT, rate)
    counter(c.SPEC_DRAFTS, base, COUNT, drafts)
    counter(c.ITERATION_FAILURES, base, CONSTANT, "0.0")  # a healthy engine's
    counter(c.SPEC_DRAFT_TOKENS, base, COUNT, drafts, K)
    counter(c.SPEC_ACCEPTED_TOKENS, base, COUNT, drafts, K * ACCEPTANCE)
    gauge(c.SPEC_THRESHOLD, CONSTANT, f"{sku.threshold}.0")
    gauge(c.SPEC_EXPLORATION_RATIO, CONSTANT, str(EXPLORATION))
    counter(c.SIMULATED_OVERRUNS, base, CONSTANT, "0.0")
    info = labels(device=sku.device, draft="llama-3.2-1b", model="llama-3.1-8b",
                  simulated="false", version=VERSION)  # fmt: skip
    page.add(c.ENGINE_INFO, "gauge", f"{c.ENGINE_INFO}{{{info}}}", CONSTANT, "1.0")


def pages(deployments: Sequence[Deployment], targets: int) -> list[Page]:
    """The fleet's series split over `targets` pages, whole deployments to each."""
    out = [Page() for _ in range(min(targets, len(deployments)))]
    for i, d in enumerate(deployments):
        for pod in d.pods:
            engine_series(out[i * len(out) // len(deployments)], pod)
    return out


def serve_exporter(deployments: int, pods: int, targets: int) -> None:
    """The exporter process: one HTTP server per target; a line of JSON on stdout for the
    ports, then one per scrape. It ends when its stdin closes (the benchmark ended)."""
    start, lock = time.monotonic(), threading.Lock()

    def say(**message: Any) -> None:
        with lock:
            print(json.dumps(message), flush=True)

    def handler(index: int, page: Page) -> type[http.server.BaseHTTPRequestHandler]:
        class Metrics(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                began = time.monotonic()
                body = page.render(began - start)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                say(scraped=index, seconds=time.monotonic() - began, bytes=len(body))

            def log_message(self, *_: Any) -> None:
                pass

        return Metrics

    servers = [
        http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler(i, page))
        for i, page in enumerate(pages(fleet(deployments, pods), targets))
    ]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    say(ports=[s.server_address[1] for s in servers])
    sys.stdin.read()


class BenchError(Exception):
    """Something the benchmark needs did not work: one line for the user."""


@dataclass
class Scrapes:
    """What the exporter reported: scrapes per target, and the last one's seconds and size."""

    ports: list[int] = field(default_factory=list)
    counts: dict[int, int] = field(default_factory=dict)
    last: dict[int, tuple[float, int]] = field(default_factory=dict)  # -> (seconds, bytes)

    @property
    def rounds(self) -> int:
        """Scrapes every target has had."""
        return min((self.counts.get(i, 0) for i in range(len(self.ports))), default=0)


@contextlib.contextmanager
def exporter(deployments: int, pods: int, targets: int) -> Iterator[Scrapes]:
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve-exporter", "--deployments", str(deployments),
         "--pods", str(pods), "--targets", str(targets)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    scrapes, ready = Scrapes(), threading.Event()

    def follow() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            message = json.loads(line)
            if "ports" in message:
                scrapes.ports = message["ports"]
                ready.set()
            else:
                i = message["scraped"]
                scrapes.counts[i] = scrapes.counts.get(i, 0) + 1
                scrapes.last[i] = message["seconds"], message["bytes"]
        ready.set()  # ended

    threading.Thread(target=follow, daemon=True).start()
    try:
        if not ready.wait(300) or not scrapes.ports:
            raise BenchError("the stand-in exporter did not start (see its error above)")
        yield scrapes
    finally:
        process.terminate()
        process.wait(30)


@contextlib.contextmanager
def prometheus(binary: Path, ports: Sequence[int], interval: float) -> Iterator[str]:
    """A Prometheus of its own in a temporary directory, scraping the exporter's targets;
    yields its URL."""
    with tempfile.TemporaryDirectory(prefix="prometheus-load-") as tmp:
        config = {
            "global": {"scrape_interval": f"{interval:g}s", "scrape_timeout": f"{interval:g}s"},
            "scrape_configs": [{
                "job_name": "spectune-engines", "honor_labels": True,
                "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports]}],
            }],
        }  # fmt: skip
        (Path(tmp) / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        log = Path(tmp) / "prometheus.log"
        with log.open("w") as out:
            process = subprocess.Popen(
                [str(binary), f"--config.file={tmp}/prometheus.yml",
                 f"--storage.tsdb.path={tmp}/data", f"--web.listen-address=127.0.0.1:{port}"],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while not ready(url):
                if process.poll() is not None or time.monotonic() > deadline:
                    tail = log.read_text().strip().splitlines()[-1:] or ["no log"]
                    raise BenchError(f"Prometheus did not start: {tail[0]}")
                time.sleep(0.2)
            yield url
        finally:
            process.terminate()
            process.wait(30)


def ready(url: str) -> bool:
    try:
        return HTTP.open(f"{url}/-/ready", timeout=2).status == 200
    except OSError:
        return False


@dataclass(frozen=True)
class Usage:
    """Prometheus's own counters (its /metrics) at one instant, or between two."""

    queries: float  # HTTP requests to /api/v1/query*
    other_api: float  # to the rest of /api/v1/
    query_seconds: float  # its time answering the queries
    cpu_seconds: float
    series: float  # in its head block (now, either way)
    resident_bytes: float

    def __sub__(self, before: Usage) -> Usage:
        return Usage(
            self.queries - before.queries,
            self.other_api - before.other_api,
            self.query_seconds - before.query_seconds,
            self.cpu_seconds - before.cpu_seconds,
            self.series,
            self.resident_bytes,
        )


def usage(url: str) -> Usage:
    text = HTTP.open(f"{url}/metrics", timeout=10).read().decode()
    got = {"queries": 0.0, "other_api": 0.0, "query_seconds": 0.0}
    single: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            handler = s.labels.get("handler", "")
            query = handler.startswith("/api/v1/query")
            if s.name == "prometheus_http_requests_total" and handler.startswith("/api/v1/"):
                got["queries" if query else "other_api"] += s.value
            elif s.name == "prometheus_http_request_duration_seconds_sum" and query:
                got["query_seconds"] += s.value
            elif not s.labels:
                single[s.name] = s.value
    return Usage(
        **got,
        cpu_seconds=single["process_cpu_seconds_total"],
        series=single["prometheus_tsdb_head_series"],
        resident_bytes=single["process_resident_memory_bytes"],
    )


@dataclass(frozen=True)
class Reconcile:
    """One deployment's turn: what its read found and how long the turn took."""

    deployment: str
    served: int  # engines
    skus: frozenset[str]  # the devices they run on
    found: int  # engines in the window
    steps: dict[str, int]  # device -> decode steps in the window
    read_seconds: float  # tuning.observe, which reads
    decide_seconds: float  # tuning.tune
    phase: str  # the calibration phase it decided
    error: str | None

    @property
    def seconds(self) -> float:
        return self.read_seconds + self.decide_seconds

    @property
    def complete(self) -> bool:
        """Every engine served in the window, decode steps on every SKU served."""
        return (
            self.error is None
            and self.found == self.served
            and set(self.steps) == self.skus
            and all(n > 0 for n in self.steps.values())
        )


class Operator:
    """The operator's turn for each deployment, less the API server: observe (the read) and
    the decision, on ready pods and the status a first turn finds (none)."""

    def __init__(self, url: str, window: int) -> None:
        self.reader = PrometheusReader(url)  # one per Prometheus, as handlers.prometheus()
        self.window = window
        self.intervals: dict[str, float | None] = {}  # the memo's scrape interval

    def spec(self, d: Deployment) -> SpecDeploymentSpec:
        return parse_spec({
            "replicas": len(d.pods),
            "model": {"name": "llama-3.1-8b"},
            "speculation": {"method": "draft", "draft": "llama-3.2-1b",
                            "threshold": {"mode": "Auto"}},
            "tuning": {"calibrationWindowSeconds": self.window},
        })  # fmt: skip

    def turn(self, d: Deployment) -> Reconcile:
        spec, now = self.spec(d), datetime.now(UTC).replace(microsecond=0)
        since = (now - timedelta(hours=1)).isoformat()  # ready long before the window
        pods = [
            {"metadata": {"name": p.name}, "status": {"podIP": "127.0.0.1", "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": since}]}}
            for p in d.pods
        ]  # fmt: skip
        rollout = {"replicas": len(pods), "readyReplicas": len(pods), "updatedReplicas": len(pods)}
        selector = Selector(d.namespace, tuple(p.name for p in d.pods))
        state = tuning.saved_state(spec, {})
        start = time.perf_counter()
        seen = tuning.observe(
            spec, state, pods, now, lambda seconds: self.reader.read(selector, seconds), (),
            f"namespace {d.namespace}, pods of {d.name}", self.intervals.get(d.name),
        )  # fmt: skip
        read = time.perf_counter()
        turn = tuning.tune(d.name, spec, {}, 1, pods, rollout, seen, EXPLORATION_LEASE_SECONDS)
        decided = time.perf_counter()
        self.intervals[d.name] = seen.scrape_interval_or(self.intervals.get(d.name))
        engines, steps = (seen.window.engines, seen.window.steps) if seen.window else ({}, {})
        return Reconcile(
            d.name, len(d.pods), d.skus, len(engines),
            {sku: sum(s.steps for s in by.values()) for sku, by in steps.items()},
            read - start, decided - read, turn.state.calibration.phase, seen.error,
        )  # fmt: skip


@dataclass(frozen=True)
class Phase:
    """Turns, how long they took in all, and what Prometheus did meanwhile."""

    reconciles: tuple[Reconcile, ...]
    seconds: float
    load: Usage
    rounds: tuple[float, ...] = ()  # each round's wall time, for the concurrent rounds

    @property
    def queries_per_read(self) -> float:
        return self.load.queries / len(self.reconciles)


def measured(url: str, turns: Callable[[], tuple[list[Reconcile], tuple[float, ...]]]) -> Phase:
    before, start = usage(url), time.monotonic()
    reconciles, rounds = turns()
    seconds = time.monotonic() - start
    return Phase(tuple(reconciles), seconds, usage(url) - before, rounds)


@dataclass(frozen=True)
class Settings:
    """One run: by default issue 33's fleet at kube-prometheus-stack's scrape interval."""

    deployments: int = 100
    pods: int = 10
    scrape_interval: float = 30.0
    window: int = 240
    rounds: int = 3
    threads: int = TURN_THREADS
    targets: int = 10
    prometheus: Path = PROMETHEUS

    @property
    def warm_up(self) -> float:
        """From the first scrape until a read's window holds only scraped data."""
        return max(self.window + 2 * self.scrape_interval, MIN_WARM_UP_SECONDS)


@dataclass(frozen=True)
class Report:
    """What a run measured; `table` sets it beside the targets."""

    settings: Settings
    one_at_a_time: Phase
    concurrent: Phase
    scraping_cores: float  # Prometheus's CPU while it only scraped
    targets: int
    scrape_bytes: int  # a round of scrapes of every target
    serve_seconds: float  # the exporter's time for that round

    def table(self) -> str:
        s, one, many = self.settings, self.one_at_a_time, self.concurrent
        n, per_read = len(one.reconciles), one.queries_per_read
        rate = per_read / RESYNC_SECONDS
        served = sum(r.served for r in one.reconciles)
        cpu = (one.load.cpu_seconds - self.scraping_cores * one.seconds) / n  # the reads'
        rows = [
            ("reconcile (read + decision), one deployment at a time: median / p95 / max",
             f"< {TARGET_RECONCILE_SECONDS:g} s", spread(one.reconciles),
             met(max(r.seconds for r in one.reconciles) < TARGET_RECONCILE_SECONDS)),
            (f"the same, all {n} each {RESYNC_SECONDS:g} s from {s.threads} threads "
             f"({s.rounds} rounds): median / p95 / max", f"< {TARGET_RECONCILE_SECONDS:g} s",
             spread(many.reconciles),
             met(max(r.seconds for r in many.reconciles) < TARGET_RECONCILE_SECONDS)),
            ("of which the decision (`tuning.tune`): median", "",
             f"{1e3 * statistics.median(r.decide_seconds for r in one.reconciles):.1f} ms", ""),
            ("a round of every deployment's turn from the threads: median / max", "",
             f"{statistics.median(many.rounds):.2f} / {max(many.rounds):.2f} s",
             f"{'within' if max(many.rounds) <= RESYNC_SECONDS else 'over'} "
             f"{RESYNC_SECONDS:g} s"),
            ("queries per read (counted by Prometheus)", "", f"{per_read:.1f}", ""),
            (f"queries/s per deployment at one read per {RESYNC_SECONDS:g} s",
             f"< {TARGET_QUERIES_PER_SECOND:g}", f"{rate:.2f}",
             met(rate < TARGET_QUERIES_PER_SECOND)),
            (f"queries/s on Prometheus, {n} deployments at that cadence", "",
             f"{n * rate:.1f}", ""),
            ("Prometheus answering one read: its query time / its CPU less scraping's", "",
             f"{one.load.query_seconds / n:.3f} / {cpu:.3f} s", ""),
            (f"Prometheus CPU for {n} deployments' reads at that cadence", "",
             f"{n * cpu / RESYNC_SECONDS:.2f} cores (scraping alone: {self.scraping_cores:.2f})",
             ""),
            ("other Prometheus API requests per read", "", f"{one.load.other_api / n:.1f}", ""),
            ("engines in the windows / served", "all",
             f"{sum(r.found for r in one.reconciles)} / {served}",
             met(all(r.complete for r in (*one.reconciles, *many.reconciles)))),
            ("series in Prometheus's head", "", f"{many.load.series:,.0f}", ""),
            ("Prometheus resident memory", "", f"{many.load.resident_bytes / 2**30:.2f} GiB", ""),
            (f"a scrape of each of the {self.targets} targets (the stand-in exporter)", "",
             f"{self.scrape_bytes / 1e6:.1f} MB, served in {self.serve_seconds:.2f} s", ""),
        ]  # fmt: skip
        out = ["| measure | target | result | |", "|---|---|---|---|"]
        out += [f"| {' | '.join(row)} |" for row in rows]
        phases = sorted({r.phase for r in one.reconciles})
        errors = {r.error for r in (*one.reconciles, *many.reconciles) if r.error}
        out.append(f"\ndecided: {', '.join(phases)}; read errors: {len(errors) or 'none'}")
        out += [f"  {e[:300]}" for e in sorted(errors)[:3]]
        return "\n".join(out)


def spread(reconciles: Sequence[Reconcile]) -> str:
    seconds = sorted(r.seconds for r in reconciles)
    p95 = seconds[math.ceil(0.95 * len(seconds)) - 1]
    return f"{statistics.median(seconds):.3f} / {p95:.3f} / {seconds[-1]:.3f} s"


def met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def run(settings: Settings, say: Callable[[str], None]) -> Report:
    """Start the exporter and Prometheus, warm up, turn every deployment; stop both."""
    if not settings.prometheus.is_file():
        raise BenchError(f"no Prometheus at {settings.prometheus}: build it with `make binaries`")
    deployments = fleet(settings.deployments, settings.pods)
    interval = settings.scrape_interval
    say(
        f"{settings.deployments} SpecDeployments x {settings.pods} pods on "
        f"{len({p.sku for d in deployments for p in d.pods})} SKUs, scraped every {interval:g} s; "
        f"warm-up {settings.warm_up:.0f} s, then {settings.window} s windows"
    )
    with (
        exporter(settings.deployments, settings.pods, settings.targets) as scrapes,
        prometheus(settings.prometheus, scrapes.ports, interval) as url,
    ):
        until(lambda: scrapes.rounds >= 1, 3 * interval + 60, "the first scrape of every target")
        start, baseline = time.monotonic(), None
        while (elapsed := time.monotonic() - start) < settings.warm_up:
            if baseline is None and elapsed >= settings.warm_up / 2:  # past the series' creation
                baseline = usage(url), time.monotonic()
            served = sum(s for s, _ in scrapes.last.values())
            say(
                f"warming up: {elapsed:.0f} of {settings.warm_up:.0f} s; each of the "
                f"{len(scrapes.ports)} targets scraped {scrapes.rounds} times (the last round "
                f"served in {served:.1f} s); {usage(url).series:,.0f} series in Prometheus"
            )
            time.sleep(min(interval, settings.warm_up - elapsed))
        assert baseline is not None  # the loop sleeps at most an interval at a time
        scraped, seconds = usage(url) - baseline[0], time.monotonic() - baseline[1]
        operator = Operator(url, settings.window)
        say(f"turning {len(deployments)} deployments one at a time")
        one = measured(url, lambda: ([operator.turn(d) for d in deployments], ()))
        say(f"turning them every {RESYNC_SECONDS:g} s from {settings.threads} threads")
        many = measured(url, lambda: rounds(operator, deployments, settings, say))
        return Report(
            settings, one, many, scraped.cpu_seconds / seconds, len(scrapes.ports),
            sum(b for _, b in scrapes.last.values()), sum(s for s, _ in scrapes.last.values()),
        )  # fmt: skip


def rounds(
    operator: Operator, deployments: Sequence[Deployment], settings: Settings,
    say: Callable[[str], None],
) -> tuple[list[Reconcile], tuple[float, ...]]:  # fmt: skip
    """Every deployment's turn each RESYNC_SECONDS (sooner rounds wait), from the pool."""
    out, walls, start = [], [], time.monotonic()
    with ThreadPoolExecutor(settings.threads) as pool:
        for i in range(settings.rounds):
            time.sleep(max(0.0, start + i * RESYNC_SECONDS - time.monotonic()))
            began = time.monotonic()
            out += pool.map(operator.turn, deployments)
            walls.append(time.monotonic() - began)
            say(f"round {i + 1} of {settings.rounds}: {walls[-1]:.1f} s")
    return out, tuple(walls)


def until(done: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--deployments", type=int, default=Settings.deployments)
    p.add_argument("--pods", type=int, default=Settings.pods, help="per deployment")
    p.add_argument("--scrape-interval", type=float, default=Settings.scrape_interval,
                   help="seconds (kube-prometheus-stack: 30); shorter for a quick run")  # fmt: skip
    p.add_argument("--window", type=int, help="seconds read per turn (default: the shortest "
                   "calibration window at that interval, 240 s at 30 s)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=Settings.rounds, help="of concurrent turns")
    p.add_argument("--threads", type=int, default=Settings.threads,
                   help="for them (asyncio.to_thread's default executor here)")  # fmt: skip
    p.add_argument("--targets", type=int, default=Settings.targets, help="the pods split over")
    p.add_argument("--prometheus", type=Path, default=PROMETHEUS, help="the binary")
    p.add_argument("--serve-exporter", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_exporter:
        serve_exporter(args.deployments, args.pods, args.targets)
        return 0
    window = args.window or round(autotune.MIN_SCRAPES_PER_WINDOW * args.scrape_interval)
    if min(args.deployments, args.pods, args.rounds, args.threads, args.targets) < 1:
        p.error("--deployments, --pods, --rounds, --threads and --targets must be >= 1")
    if args.scrape_interval < 1 or window < max(10, 2 * args.scrape_interval):
        p.error("--scrape-interval must be >= 1 s and --window >= 10 s and two intervals")
    settings = Settings(args.deployments, args.pods, args.scrape_interval, window, args.rounds,
                        args.threads, args.targets, args.prometheus)  # fmt: skip
    started = time.monotonic()
    try:
        report = run(settings, lambda line: print(line, file=sys.stderr, flush=True))
    except BenchError as e:
        print(f"prometheus_load: error: {e}", file=sys.stderr)
        return 2
    print(f"\n{report.table()}\n\nran {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop Prometheus on the way out
    sys.exit(main())
