"""The Prometheus reader: against the real local Prometheus scraping a real engine pod (one
SpecDeployment's engines selected by labels, step sums per SKU and mode, traffic, unknown
never zero, engines that just started left out), and against a Prometheus that is down or
answers garbage."""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from spectune.engine import contract
from spectune.operator.observations import Traffic
from spectune.operator.prometheus import (
    FIGURES,
    FleetWindow,
    LabelNames,
    PrometheusReader,
    PrometheusUnavailable,
    Selector,
)
from tests.chart.support import dashboard_exprs
from tests.cluster.support import ENGINE_LABEL, LOCAL, Cluster, is_loopback
from tests.server.metrics_text import parse, total
from tests.support.ports import free_port
from tests.support.waiting import wait_until

PORT = 8000
INSTANCE = "reader-test"
WINDOW = 120
# Engines listen on loopback pod IPs: never through a proxy.
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def test_matchers_select_pods_by_name_with_the_configured_label_names() -> None:
    default = Selector("ns-1", ("llm-b", "llm.a"))
    assert default.matchers() == r'{namespace="ns-1",pod=~"llm-b|llm\\.a"}'
    custom = Selector('a"b\\c', ("x-0",), LabelNames(namespace="kube_ns", pod="kube_pod"))
    assert custom.matchers(outcome="ok") == r'{kube_ns="a\"b\\c",kube_pod=~"x-0",outcome="ok"}'
    assert Selector("ns", ()).matchers() == '{namespace="ns",pod=~"-"}'  # no pod: matches none


class Recorded:
    """A PrometheusConnect that answers every query with `result` and keeps the queries."""

    def __init__(self, result: list[dict[str, Any]]) -> None:
        self.result, self.queries, self.times = result, [], []

    def custom_query(self, query: str, params: dict | None = None) -> list[dict[str, Any]]:
        self.queries.append(query)
        self.times.append((params or {}).get("time"))
        return self.result


class Instants(Recorded):
    """The clock and the engines answered; no series for the sums or the scrape interval."""

    def custom_query(self, query: str, params: dict | None = None) -> list[dict[str, Any]]:
        result = super().custom_query(query, params)
        return result if query.startswith(("vector", "timestamp")) else []


class Clock(Recorded):
    """Only the clock answered: no engine is fresh."""

    def custom_query(self, query: str, params: dict | None = None) -> list[dict[str, Any]]:
        result = super().custom_query(query, params)
        return result if query.startswith("vector") else []


def test_engines_that_just_started_are_left_out_by_the_query() -> None:
    """Warm: the info series had a sample `warm_up_seconds` ago too (`and` keeps the left
    side's timestamps); the real Prometheus runs it in the cluster tests below."""
    info = {"metric": {"pod": "e-0", "device": "H100"}, "value": [1000.0, "995.0"]}
    client = Recorded([info])
    reader = PrometheusReader("http://unused", warm_up_seconds=20, client=client)
    engines = reader.engines(Selector("ns", ("e-0",)))
    assert engines["e-0"].age_seconds == 5.0
    info_sel = 'spectune_engine_info{namespace="ns",pod=~"e-0"}'
    assert client.queries == [f"timestamp({info_sel}) and {info_sel} offset 20000ms"]
    cold = Recorded([info])
    PrometheusReader("http://unused", warm_up_seconds=0, client=cold).engines(
        Selector("ns", ("e-0",))
    )
    assert cold.queries == [f"timestamp({info_sel})"]


def test_one_read_evaluates_every_query_at_one_instant() -> None:
    """A bucket's steps, tokens and seconds, and the traffic, all end at the same instant:
    Prometheus's own, asked once (each query at its own "now" could straddle a scrape)."""
    info = {"metric": {"pod": "e-0", "device": "H100"}, "value": [1000.0, "995.0"]}

    client = Instants([info])
    PrometheusReader("http://unused", client=client).read(Selector("ns", ("e-0",)), WINDOW)
    assert client.queries[0] == "vector(time())"
    assert len(client.queries) == 4 and client.times[0] is None
    assert set(client.times[1:]) == {1000.0}


def test_the_window_is_one_query_aggregated_in_promql_over_the_fresh_engines() -> None:
    """Every figure in one query, summed by SKU (joined from the info series), mode and bucket,
    or over the whole fleet, in Prometheus; each pod's series first reduced to one per engine
    label set, so that a pod two jobs scrape counts once (the real Prometheus runs it below).
    A pod that is not fresh is not in the query; with none fresh there is no window query."""
    info = {"metric": {"pod": "e-0", "device": "H100"}, "value": [1000.0, "995.0"]}
    client = Instants([info])
    reader = PrometheusReader("http://unused", client=client)
    reader.read(Selector("ns", ("e-0", "e-1")), WINDOW)
    query = client.queries[-1]
    fresh = '{namespace="ns",pod=~"e-0"}'
    steps = f"{contract.STEP_SECONDS}_count{fresh}[{WINDOW}s]"
    assert (
        f"sum by (device,mode,batch) (max by (pod,mode,batch) (increase({steps}))"
        f" * on (pod) group_left (device) group by (pod,device) ({contract.ENGINE_INFO}{fresh}))"
    ) in query
    e2e = f"{contract.E2E_REQUEST_LATENCY}_bucket{fresh}[{WINDOW}s]"
    assert f"histogram_quantile(0.95, sum by (le) (max by (pod,le) (increase({e2e}))))" in query
    assert query.count("label_replace(") == len(FIGURES) and "e-1" not in query

    clock = {"metric": {}, "value": [1000.0, "1000.0"]}
    none_fresh = Clock([clock])
    window = PrometheusReader("http://unused", client=none_fresh).read(
        Selector("ns", ("e-0",)), WINDOW
    )
    assert len(none_fresh.queries) == 3 and window.traffic.requests is None


class Batched(Instants):
    """Engines scraped every 2 s, and each batch of the window answered by a range query."""

    def __init__(self, result: list[dict[str, Any]], batches: list[dict[str, Any]]) -> None:
        super().__init__(result)
        self.batches, self.ranges = batches, []

    def custom_query(self, query: str, params: dict | None = None) -> list[dict[str, Any]]:
        if query.endswith("[120s]"):
            super().custom_query(query, params)
            return [{"metric": {"pod": "e-0"}, "values": [[996.0, "1"], [998.0, "1"]]}]
        return super().custom_query(query, params)

    def custom_query_range(self, query: str, start_time, end_time, step: str) -> list[dict]:
        self.queries.append(query)
        self.ranges.append((start_time.timestamp(), end_time.timestamp(), step))
        return self.batches


def test_the_noise_comes_from_the_windows_batches_one_range_query_every_scrape() -> None:
    """The window's batches: each counter's increase since one scrape interval before, at every
    interval through the window, summed by SKU (joined), mode and bucket in PromQL; a pod's
    restart (a counter that fell) drops out. Their spread is the throughput's noise."""
    info = {"metric": {"pod": "e-0", "device": "H100"}, "value": [1000.0, "995.0"]}
    labels = {"device": "H100", "mode": "spec", "batch": "8"}
    times = [1000.0 - 2 * k for k in range(10)]
    batches = [
        {"metric": {**labels, "spectune_figure": "batch_tokens"},
         "values": [[t, "110" if k % 2 else "90"] for k, t in enumerate(times)]},
        {"metric": {**labels, "spectune_figure": "batch_seconds"},
         "values": [[t, "1"] for t in times]},
    ]  # fmt: skip
    client = Batched([info], batches)
    window = PrometheusReader("http://unused", client=client).read(Selector("ns", ("e-0",)), 20)
    assert len(client.queries) == 5 and client.ranges == [(982.0, 1000.0, "2s")]
    query = client.queries[-1]
    fresh = '{namespace="ns",pod=~"e-0"}'
    tokens = f"{contract.STEP_OUTPUT_TOKENS}{fresh}"
    assert (
        f"((max by (pod,mode,batch) ({tokens}) - max by (pod,mode,batch) ({tokens} offset 2s))"
        " >= 0)"
    ) in query
    assert "group_left (device)" in query and "sum by (device,mode,batch)" in query
    # rate 100 over 10 batches of 1 s, each 10 off: sqrt(10/9 * 1000) / 1000 tokens
    assert window.noise == {"H100": {("spec", 8): pytest.approx((10 / 9 * 1000) ** 0.5 / 1000)}}


def test_the_scrape_interval_is_read_from_the_samples_and_stretches_staleness() -> None:
    """At the 30 s interval most clusters scrape at, a 30 s staleness would drop engines
    between two scrapes and a 15 s warm-up would count a counter with one sample."""
    series = [
        {"metric": {"pod": "e-0"}, "values": [[900.0, "1"], [930.0, "1"], [960.0, "1"]]},
        {"metric": {"pod": "e-1"}, "values": [[905.0, "1"], [935.0, "1"]]},
    ]
    reader = PrometheusReader("http://unused", client=Recorded(series))
    assert reader.scrape_interval(Selector("ns", ("e-0",)), 1000.0) == 30.0
    assert reader.client.times == [1000.0]
    assert (
        PrometheusReader("http://unused", client=Recorded([])).scrape_interval(
            Selector("ns", ("e-0",))
        )
        is None
    )
    info = {"metric": {"pod": "e-0", "device": "H100"}, "value": [1000.0, "955.0"]}  # 45 s old
    client = Recorded([info])
    reader = PrometheusReader("http://unused", client=client)
    assert "e-0" in reader.engines(Selector("ns", ("e-0",)), 1000.0, interval=30.0)
    assert client.queries[-1].endswith("offset 60000ms")  # two scrapes back
    assert "e-0" not in reader.engines(Selector("ns", ("e-0",)), 1000.0)  # 30 s staleness


def test_prometheus_down_is_an_error_not_unknown() -> None:
    with socket.socket() as s:  # a loopback port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    reader = PrometheusReader(f"http://127.0.0.1:{port}", timeout_seconds=2)
    with pytest.raises(PrometheusUnavailable):
        reader.read(Selector("ns", ("e-0",)), WINDOW)


@pytest.mark.parametrize(
    "body",
    [b"<html>not prometheus</html>", b'{"status": "success", "data": {"result": "x"}}',
     b'{"status": "success", "data": {"result": [{"metric": {}, "value": [1, "y"]}]}}'],
)  # fmt: skip
def test_garbage_from_prometheus_is_an_error(body: bytes) -> None:
    class Garbage(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Garbage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        reader = PrometheusReader(f"http://127.0.0.1:{server.server_port}", timeout_seconds=2)
        with pytest.raises(PrometheusUnavailable):
            reader.engines(Selector("ns", ("e-0",)))
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def engine_pod(cluster: Cluster, tiny_pair: tuple[Path, Path]) -> Iterator[Any]:
    """One engine pod of a SpecDeployment-like instance, exploring 30% of iterations so that
    both modes get steps; yields the pod once its engine is ready."""
    ns = f"reader-{uuid.uuid4().hex[:8]}"
    labels = {**ENGINE_LABEL, "app.kubernetes.io/instance": INSTANCE}
    deployment = {
        "metadata": {"name": "engine", "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "prometheus.io/scrape": "true", "prometheus.io/port": str(PORT)
                    },
                },
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                    "containers": [{
                        "name": "engine",
                        "image": "ghcr.io/spectune/spectune-engine:dev",
                        "args": ["--model", "tiny-target", "--method", "ngram", "--device", "cpu",
                                 "--exploration", "0.3"],
                        "ports": [{"name": "http", "containerPort": PORT}],
                    }],
                },
            },
        },
    }  # fmt: skip
    with cluster.api() as api:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        try:
            apps.create_namespaced_deployment(ns, deployment)

            def running() -> Any:
                pods = core.list_namespaced_pod(ns).items
                return next(
                    (p for p in pods if p.status.phase == "Running" and p.status.pod_ip), None
                )

            pod = wait_until("the engine pod to run", running)
            assert is_loopback(pod.status.pod_ip)
            base = f"http://{pod.status.pod_ip}:{PORT}"
            wait_until("the engine to be ready", lambda: HTTP.open(f"{base}/readyz"), timeout=180)
            yield pod
        finally:
            core.delete_namespace(ns)


def complete_prompt(client: int, n: int) -> str:
    return f"def function_{client}_{n}(self, value):\n    return value"


def complete(base: str, prompt: str) -> bool:
    body = json.dumps({"model": "tiny-target", "prompt": prompt, "max_tokens": 24}).encode()
    request = urllib.request.Request(
        f"{base}/v1/completions", body, {"Content-Type": "application/json"}
    )
    with HTTP.open(request, timeout=60) as r:
        return r.status == 200


def drive(base: str, seconds: float, concurrency: int = 3) -> int:
    """Completions from `concurrency` clients for `seconds`, spread over several scrapes (a
    counter's first scraped value is not an increase); returns how many succeeded."""
    deadline = time.monotonic() + seconds

    def client_loop(i: int) -> int:
        done = 0
        while time.monotonic() < deadline:
            done += complete(base, complete_prompt(i, done))
        return done

    with ThreadPoolExecutor(concurrency) as pool:
        return sum(pool.map(client_loop, range(concurrency)))


@pytest.mark.cluster
def test_reads_one_deployments_engines_from_the_real_prometheus(
    cluster: Cluster, engine_pod: Any
) -> None:
    ns, name = engine_pod.metadata.namespace, engine_pod.metadata.name
    reader = PrometheusReader(cluster.prometheus_url)
    mine = Selector(ns, (name,))
    wait_until("Prometheus to scrape the engine", lambda: reader.engines(mine), timeout=60)

    sent = drive(f"http://{engine_pod.status.pod_ip}:{PORT}", seconds=15)
    assert sent > 0

    def scraped() -> FleetWindow | None:
        window = reader.read(mine, WINDOW)
        return window if (window.traffic.requests or 0) >= 0.8 * sent else None

    window = wait_until("the traffic's counters in Prometheus", scraped, timeout=30)
    (info,) = window.engines.values()
    assert info.pod == name and info.device and info.model
    assert info.age_seconds <= reader.stale_after
    assert window.skus == {info.device}
    assert set(window.steps) == {info.device}
    stats = window.steps[info.device]
    assert {mode for mode, _ in stats} == {"spec", "plain"}, stats
    for s in stats.values():
        assert s.steps > 0 and s.tokens >= s.steps and s.seconds > 0
    # the batches' range query parses and answers: a noise for buckets both modes ran in
    noise = window.noise.get(info.device, {})
    assert noise and all(0 <= v < 1 for v in noise.values()), noise
    assert set(noise) <= set(stats), (noise, stats)
    t = window.traffic
    assert t.requests is not None and t.requests <= 1.3 * sent
    assert t.slo_met is not None and 0 <= t.slo_met <= t.requests * 1.01
    assert t.rejected_requests == 0 and t.judged_requests == t.ok_requests
    assert t.acceptance is not None and 0 <= t.acceptance <= 1
    assert t.tokens_per_request is not None and 1 <= t.tokens_per_request <= 24 * 1.3
    # every prompt drive() sends is "def function_{i}_{n}(self, value):\n    return value"
    assert t.prompt_tokens_per_request is not None
    assert 10 <= t.prompt_tokens_per_request <= len(complete_prompt(0, 0)) + 8
    assert t.decode_tokens == pytest.approx(sum(s.tokens for s in stats.values()), rel=0.01)
    assert t.mean_running is not None and t.mean_running >= 0
    assert t.admitted_concurrency is not None and t.admitted_concurrency >= 1
    assert t.mean_inter_token_seconds is not None and t.mean_inter_token_seconds > 0
    # the p95 the combined window query carries is what histogram_quantile asked alone says
    # over the same window (the figure survives label_replace and `or` unchanged)
    real = cluster.prometheus(
        "/api/v1/query",
        query=f"histogram_quantile(0.95, sum by (le) (increase("
        f"{contract.E2E_REQUEST_LATENCY}_bucket{mine.matchers()}[{WINDOW}s])))",
    )["result"]
    again = reader.read(mine, WINDOW).traffic.e2e_p95_seconds
    assert again is not None and again == pytest.approx(float(real[0]["value"][1]), rel=0.05)


@contextlib.contextmanager
def private_prometheus(
    tmp_path: Path, pod: Any, labels: dict[str, str], jobs: tuple[str, ...]
) -> Iterator[str]:
    """A Prometheus of its own that scrapes the engine pod every 2 s in each of `jobs`, its
    series carrying `labels`; yields its URL."""
    target = {"targets": [f"{pod.status.pod_ip}:{PORT}"], "labels": labels}
    config = {
        "global": {"scrape_interval": "2s", "scrape_timeout": "2s"},
        "scrape_configs": [{"job_name": job, "static_configs": [target]} for job in jobs],
    }
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    prometheus = subprocess.Popen(
        [str(LOCAL / "bin" / "prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until("the private Prometheus to be ready", lambda: HTTP.open(f"{url}/-/ready"))
        yield url
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)
        log.close()


@pytest.fixture
def scraped_twice(tmp_path: Path, engine_pod: Any) -> Iterator[str]:
    """A second Prometheus that scrapes the engine pod in two jobs, as a cluster does that has
    annotation discovery and a PodMonitor both: every series twice, told apart only by `job`.
    Yields its URL."""
    meta = engine_pod.metadata
    labels = {"namespace": meta.namespace, "pod": meta.name, "app_kubernetes_io_instance": INSTANCE}
    with private_prometheus(
        tmp_path, engine_pod, labels, ("kubernetes-pods", "podmonitor/engines")
    ) as url:
        yield url


@pytest.mark.cluster
def test_engines_are_read_by_pod_names_without_the_instance_label(
    tmp_path: Path, engine_pod: Any
) -> None:
    """Only the target labels the Prometheus Operator gives a PodMonitor's targets by itself
    (no podTargetLabels): the engine is found and its requests counted by namespace and pod
    name, which the operator has from the API server; the instance label finds nothing."""
    meta = engine_pod.metadata
    labels = {"namespace": meta.namespace, "pod": meta.name, "container": "engine"}
    job = f"podMonitor/{meta.namespace}/engines/0"
    with private_prometheus(tmp_path, engine_pod, labels, (job,)) as url:
        reader = PrometheusReader(url)
        by_pods = Selector(meta.namespace, (meta.name, "gone-0"))
        wait_until("the engine found by its pod name", lambda: reader.engines(by_pods))
        assert reader.engines(Selector(meta.namespace, ("gone-0",))) == {}
        sent = drive(f"http://{engine_pod.status.pod_ip}:{PORT}", seconds=4)

        def counted() -> FleetWindow | None:
            window = reader.read(by_pods, WINDOW)
            return window if (window.traffic.requests or 0) >= 0.8 * sent else None

        window = wait_until("the requests counted", counted, timeout=60)
        # not more: increase() extrapolates a series that starts inside the window by up to
        # half a scrape interval at each edge (a CI run read 74.3 for 69 sent)
        assert window.traffic.requests <= sent * 1.3


@pytest.mark.cluster
def test_a_pod_two_jobs_scrape_counts_once(engine_pod: Any, scraped_twice: str) -> None:
    """Requests and decode steps as the engine counted them, not twice that; and every query
    of the chart's dashboard answers (a join on the engine's info series that two jobs double
    would fail as many-to-many), its per-SKU panels grouped by the engine's device."""
    reader, mine = (
        PrometheusReader(scraped_twice),
        Selector(engine_pod.metadata.namespace, (engine_pod.metadata.name,)),
    )
    wait_until("the second Prometheus to scrape the engine", lambda: reader.engines(mine))
    jobs = reader.client.custom_query(f"count by (job) ({contract.ENGINE_INFO}{mine.matchers()})")
    assert len(jobs) == 2  # the same series from two jobs
    base = f"http://{engine_pod.status.pod_ip}:{PORT}"

    def steps() -> float:
        page = parse(HTTP.open(f"{base}/metrics").read().decode())
        return total(page, contract.STEP_SECONDS + "_count")

    before = steps()
    sent = drive(base, seconds=10)
    ran = steps() - before

    def counted() -> FleetWindow | None:
        window = reader.read(mine, WINDOW)
        return window if (window.traffic.requests or 0) >= 0.8 * sent else None

    window = wait_until("the traffic in the second Prometheus", counted, timeout=30)
    assert window.traffic.requests is not None and window.traffic.requests <= 1.3 * sent
    (stats,) = window.steps.values()
    assert sum(s.steps for s in stats.values()) == pytest.approx(ran, rel=0.3)

    variables = {"$__rate_interval": "1m", "$namespace": engine_pod.metadata.namespace,
                 "$specdeployment": INSTANCE}  # fmt: skip
    queries = dashboard_exprs(variables)
    answers = {what: reader.client.custom_query(expr) for what, expr in queries.items()}
    (device,) = {info.device for info in window.engines.values()}
    per_sku = [what for what in answers if "SKU" in what and "crossover" not in what]
    assert len(per_sku) == 2, per_sku  # step throughput and speedup
    for what in per_sku:
        assert answers[what], what
        assert {r["metric"]["device"] for r in answers[what]} == {device}, answers[what]


class Later(PrometheusReader):
    """A reader that asks its questions `ahead` seconds after Prometheus's now."""

    def __init__(self, url: str, ahead: float, warm_up_seconds: float) -> None:
        super().__init__(url, warm_up_seconds=warm_up_seconds)
        self.ahead = ahead

    def now(self) -> float:
        return super().now() + self.ahead


@pytest.mark.cluster
@pytest.mark.parametrize(
    "other_pod, labels, ahead, warm_up",
    [
        (True, LabelNames(), 0.0, 15.0),  # no pod of that name: nothing matches
        (False, LabelNames(pod="kube_pod"), 0.0, 15.0),  # a label name this setup lacks
        (False, LabelNames(), 100.0, 15.0),  # every series is 100 s old: stale
        (False, LabelNames(), 0.0, 86400.0),  # every engine counts as just started
    ],
)
def test_missing_stale_or_cold_data_is_unknown_not_zero(
    cluster: Cluster,
    engine_pod: Any,
    other_pod: bool,
    labels: LabelNames,
    ahead: float,
    warm_up: float,
) -> None:
    ns, pod = engine_pod.metadata.namespace, engine_pod.metadata.name
    wait_until(
        "Prometheus to scrape the engine",
        lambda: PrometheusReader(cluster.prometheus_url).engines(Selector(ns, (pod,))),
        timeout=60,
    )
    reader = Later(cluster.prometheus_url, ahead, warm_up)
    window = reader.read(Selector(ns, (f"{pod}-other" if other_pod else pod,), labels), WINDOW)
    assert window.engines == {} and window.steps == {} and window.skus == frozenset()
    assert window.traffic == Traffic(seconds=WINDOW)
    assert window.traffic.request_rate is None and window.traffic.acceptance is None
