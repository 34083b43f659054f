"""What the autotuner's end-to-end tests drive and read: bounded closed-loop load on the
engines behind the pods (loopback pod IPs only), each engine's live speculation settings, the
SpecDeployment's Events, and the device model's crossover for what an engine ran."""

from __future__ import annotations

import inspect
import json
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Any

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from spectune.engine import contract
from spectune.engine.device_time import LLAMA_8B, SKUS, Setting, analytic_crossover
from tests.cluster.support import Cluster, is_loopback

from .support import HTTP, PORT, get_sd

CLIENTS, MAX_REQUESTS, LOAD_SECONDS = 8, 4000, 240
PROMPTS = [line for line in inspect.getsource(json).splitlines() if len(line) > 30][:64]


class Load:
    """Closed-loop clients against the pods' engines, bounded in requests and time: `clients`
    of them, or as many as `clients(seconds since the start)` says at each moment."""

    def __init__(
        self,
        urls: list[str],
        clients: int | Callable[[float], int] = CLIENTS,
        seconds: float = LOAD_SECONDS,
        temperature: float = 0.0,
        requests: int = MAX_REQUESTS,
    ) -> None:
        self.urls, self.sent, self.failed, self.requests = urls, 0, 0, requests
        self.temperature = temperature
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.deadline = self.started + seconds
        self.active = clients if callable(clients) else lambda _: clients
        most = clients if isinstance(clients, int) else max(clients(t) for t in range(int(seconds)))
        self.threads = [threading.Thread(target=self.client, args=(i,)) for i in range(most)]
        # per temperature: requests in flight, and the wall time the last one finished
        self.in_flight: Counter[float] = Counter()
        self.finished: dict[float, float] = {}

    def client(self, i: int) -> None:
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            if i >= self.active(time.monotonic() - self.started):
                self.stop.wait(0.5)
                continue
            with self.lock:
                if self.sent >= self.requests:
                    return
                self.sent += 1
                n, url = self.sent, self.urls[self.sent % len(self.urls)]
            temperature = self.temperature
            body = {"model": "tiny-target", "prompt": PROMPTS[(n + i) % len(PROMPTS)],
                    "max_tokens": 48, "temperature": temperature}  # fmt: skip
            request = urllib.request.Request(
                f"{url}/v1/completions", json.dumps(body).encode(),
                {"Content-Type": "application/json"},
            )  # fmt: skip
            with self.lock:
                self.in_flight[temperature] += 1
            try:
                with HTTP.open(request, timeout=60) as r:
                    r.read()
            except OSError:
                with self.lock:
                    self.failed += 1
                time.sleep(0.5)
            finally:
                with self.lock:
                    self.in_flight[temperature] -= 1
                    self.finished[temperature] = time.time()

    def last_finished(self, temperature: float) -> float | None:
        """When the last request at `temperature` finished (wall time), once none is in flight;
        None while one is."""
        with self.lock:
            return None if self.in_flight[temperature] else self.finished.get(temperature, 0.0)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def retarget(self, urls: list[str]) -> None:
        self.urls = urls

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(70)


def urls(pods: list[Any]) -> list[str]:
    for p in pods:
        assert is_loopback(p.status.pod_ip), p.status.pod_ip
    return [f"http://{p.status.pod_ip}:{PORT}" for p in pods]


def speculation(url: str) -> dict[str, Any]:
    with HTTP.open(f"{url}/admin/speculation", timeout=5) as r:
        return json.load(r)


def events(admin: client.ApiClient, namespace: str, name: str) -> list[Any]:
    found = client.CoreV1Api(admin).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    )
    return sorted(found.items, key=lambda e: e.metadata.creation_timestamp)


def calibration_started(
    admin: client.ApiClient, namespace: str, name: str, saying: str
) -> str | None:
    """The first CalibrationStarted Event whose message says `saying`."""
    return next(
        (
            e.message
            for e in events(admin, namespace, name)
            if e.reason == "CalibrationStarted" and saying in e.message
        ),
        None,
    )


def finished_after(
    admin: client.ApiClient, namespace: str, name: str, since: str
) -> dict[str, Any] | None:
    """The calibration status once a calibration started after `since` left Exploring."""
    cal = (get_sd(admin, namespace, name).get("status") or {}).get("calibration") or {}
    started = cal.get("startedAt")
    done = cal.get("phase") in ("Verifying", "Idle") and started
    return cal if done and unix_time(started) > unix_time(since) else None


def unix_time(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def simulated(cluster: Cluster, namespace: str) -> bool:
    info = cluster.prometheus(
        "/api/v1/query", query=f'{contract.ENGINE_INFO}{{namespace="{namespace}"}}'
    )
    return bool(info["result"]) and all(
        r["metric"].get("simulated") == "true" for r in info["result"]
    )


def stepped(levels: tuple[int, ...], seconds: float) -> Callable[[float], int]:
    """Clients stepping through `levels`, `seconds` at each, round and round: the running
    batch dwells in each level's bucket in turn, so both sides of a crossover get samples."""
    return lambda t: levels[int(t // seconds) % len(levels)]


def analytic_for(url: str, sku: str, k: int, context: int = 64) -> float:
    """The device model's crossover for what an n-gram engine ran, from its /metrics: tokens
    committed and drafted per sequence per spec step, each spec step's batch taken as the mean
    batch of its bucket's plain steps (a plain step commits one token per sequence). Prompts and
    outputs here are short; the context moves this crossover by under 2% up to 128 tokens."""
    with HTTP.open(f"{url}/metrics", timeout=5) as r:
        families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}

    def by_key(family: str, suffix: str) -> dict[tuple[str, int], float]:
        return {
            (s.labels["mode"], int(s.labels["batch"])): s.value
            for s in families[family].samples
            if s.name == family + suffix
        }

    steps = by_key(contract.STEP_SECONDS, "_count")
    tokens = by_key(contract.STEP_OUTPUT_TOKENS.removesuffix("_total"), "_total")
    mean_batch = {b: tokens[m, b] / n for (m, b), n in steps.items() if m == "plain" and n}
    seq_steps = sum(n * mean_batch.get(b, b) for (m, b), n in steps.items() if m == "spec")
    committed = sum(v for (m, _), v in tokens.items() if m == "spec")
    drafted = next(
        s.value
        for s in families[contract.SPEC_DRAFT_TOKENS.removesuffix("_total")].samples
        if s.name == contract.SPEC_DRAFT_TOKENS
    )
    found = analytic_crossover(
        Setting(SKUS[sku], LLAMA_8B, None, k, 0.0, context,
                tokens=committed / seq_steps, verified=drafted / seq_steps)
    )  # fmt: skip
    assert found is not None
    return found
