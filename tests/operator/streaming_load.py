"""Streaming load through what a Service routes to, with every request's outcome: the client
side of "a rollout refuses or cuts nothing".

`Endpoints` plays the EndpointSlice controller with kube-proxy (or an ingress) behind it: a
SpecDeployment's pods that are Ready and not terminating, read from the API server, and each
one still routed to for `lag` seconds after it left, as endpoint propagation takes. The
local cluster runs neither that controller nor kube-proxy, and nothing here may connect to a
ClusterIP. `StreamingLoad` streams chat completions through it with the real openai client,
a few at a time, for a bounded time, and books each as ok, refused (no connection), cut (the
stream broke or ended without a finish reason) or an HTTP error.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass

import httpx
import openai
from kubernetes import client

from .support import PORT, ready_pods


class Endpoints:
    """The URLs a Service would route to now (see the module docstring)."""

    def __init__(self, admin: client.ApiClient, namespace: str, name: str, lag: float) -> None:
        self.admin, self.namespace, self.name, self.lag = admin, namespace, name, lag
        self.seen: dict[str, float] = {}  # url -> when last listed as ready
        self.left: dict[str, float] = {}  # url -> when it stopped being listed
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                pods = ready_pods(self.admin, self.namespace, self.name)
            except Exception:  # an API hiccup: keep the last view
                pods = None
            if pods is not None:
                now = time.monotonic()
                urls = {f"http://{p.status.pod_ip}:{PORT}" for p in pods}
                with self._lock:
                    for url in urls:
                        self.seen[url] = now
                        self.left.pop(url, None)
                    for url in set(self.seen) - urls:
                        self.left.setdefault(url, now)
            self._stop.wait(0.25)

    def pick(self) -> tuple[str, bool] | None:
        """A URL to send to, and whether its pod had already left (still routed by the lag);
        None when there is none."""
        now = time.monotonic()
        with self._lock:
            live = [u for u, t in self.seen.items() if now - t <= self.lag]
            if not live:
                return None
            url = random.choice(live)
            return url, url in self.left

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclass(frozen=True)
class Outcome:
    url: str
    after_leaving: bool  # sent to a pod already gone from the endpoints, within the lag
    result: str  # ok | refused | cut | http <status>


class StreamingLoad:
    """`clients` threads streaming chat completions through `endpoints` until stopped (or
    `limit_s` passed), each request `max_tokens` long."""

    def __init__(
        self, endpoints: Endpoints, model: str, clients: int = 4, max_tokens: int = 24,
        limit_s: float = 600.0,
    ) -> None:  # fmt: skip
        self.endpoints, self.model, self.max_tokens = endpoints, model, max_tokens
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._deadline = time.monotonic() + limit_s
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        http = httpx.Client(trust_env=False, timeout=30)  # loopback only: no proxy
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            picked = self.endpoints.pick()
            if picked is None:
                time.sleep(0.1)
                continue
            url, after_leaving = picked
            result = self._one(http, url)
            with self._lock:
                self.outcomes.append(Outcome(url, after_leaving, result))
        http.close()

    def _one(self, http: httpx.Client, url: str) -> str:
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, http_client=http)
        tokens, finished = 0, False
        try:
            stream = api.chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": "count to twenty"}],
                max_tokens=self.max_tokens,
                stream=True,
            )
            for chunk in stream:
                tokens += 1
                finished = finished or any(c.finish_reason for c in chunk.choices)
        except openai.APIConnectionError:
            return "refused" if tokens == 0 else "cut"
        except openai.APIStatusError as err:
            return f"http {err.status_code}"
        except Exception:
            return "cut"
        return "ok" if finished else "cut"

    def stop(self) -> Counter[str]:
        """Stop and return how many requests ended each way."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)
        return Counter(o.result for o in self.outcomes)
