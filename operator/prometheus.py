"""Reading one SpecDeployment's engines from Prometheus (prometheus-api-client).

Every query is built from the names in engine/contract.py. Engines are selected by their
namespace and pod names (the operator lists its pods in the API server), which any pod scrape
carries; the label names differ between Prometheus setups (`LabelNames`: by default
`namespace` and `pod`, what the Prometheus Operator and Kubernetes pod discovery give). A read
asks which engines are fresh, so that one stale or vanished pod cannot lend old data to the
window, and warm, so that a pod that just started (a counter's first scrape is no increase, its
first steps no steady state) does not either; then every figure of the window over those pods
in one query, aggregated in PromQL (`sum by`, `histogram_quantile`, the SKU joined from the
info series), all at one evaluation time. Missing data is None (unknown), never zero;
Prometheus down or answering garbage raises `PrometheusUnavailable`.

The client is synchronous (requests): handlers call `read` through
`asyncio.to_thread`, or use a kopf sync handler, never on kopf's event loop.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from spectune.engine import contract as c
from spectune.operator.observations import (
    EngineInfo,
    FleetWindow,
    LabelNames,
    MetricsUnavailable,
)
from spectune.operator.prometheus_access import OPEN, PrometheusAccess
from spectune.operator.scraping import ScrapeTarget
from spectune.operator.window import (
    BATCH_FIGURES,
    E2E_QUANTILE,
    FIGURES,
    MIN_BATCHES,
    SKU,
    Figure,
    fleet_window,
    freshness,
)


class PrometheusUnavailable(MetricsUnavailable):
    """Prometheus could not be asked or gave an answer that is not a query result."""


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class Selector:
    """One SpecDeployment's engines, as PromQL label matchers: its namespace and the names of
    its pods, which the operator lists in the API server and every pod scrape carries (the
    Prometheus Operator adds `namespace` and `pod` to a PodMonitor's targets by itself)."""

    namespace: str
    pods: tuple[str, ...]
    labels: LabelNames = field(default_factory=LabelNames)

    def matchers(self, **extra: str) -> str:
        # pod names are [a-z0-9.-]: only a dot means more in a regex; no pod yet: "-", a name
        # no pod has, so that nothing matches
        names = "|".join(pod.replace(".", r"\.") for pod in sorted(self.pods)) or "-"
        pairs = [
            f"{self.labels.namespace}={_quote(self.namespace)}",
            f"{self.labels.pod}=~{_quote(names)}",
            *(f"{k}={_quote(v)}" for k, v in extra.items()),
        ]
        return "{" + ",".join(pairs) + "}"


class PrometheusReader:
    """Synchronous queries for the estimator and the triggers (see the module docstring)."""

    def __init__(
        self,
        url: str,
        stale_after_seconds: float = 30.0,
        warm_up_seconds: float = 15.0,
        timeout_seconds: float = 10.0,
        client: PrometheusConnect | None = None,
        access: PrometheusAccess = OPEN,
    ) -> None:
        """`stale_after_seconds`: an engine whose info series was last scraped longer ago
        is left out (a few scrape intervals); `warm_up_seconds`: so is one whose info series
        had no sample that long ago (about two scrape intervals, so its counters have two
        points); `access`: TLS, credentials and headers. Retries are the caller's, with
        back-off."""
        self.stale_after = stale_after_seconds
        self.warm_up = warm_up_seconds
        self.client = client or PrometheusConnect(
            url=url,
            headers=dict(access.headers) or None,
            retry=Retry(total=0),
            auth=access.auth(),
            session=access.session(),
            timeout=timeout_seconds,
        )

    def _query(
        self,
        query: str,
        at: float | None = None,
        sample: str = "value",
        every: tuple[float, int] | None = None,
    ) -> list[dict[str, Any]]:
        """A query evaluated at `at` (unix seconds) or Prometheus's now: an instant vector
        (each series' `value`), or with `sample="values"` a range vector; with `every=(start,
        step)`, evaluated every `step` seconds from `start` to `at` (each series' `values`)."""
        try:
            if every is None:
                result = self.client.custom_query(query, params={"time": at} if at else None)
            else:
                start, step = every
                result = self.client.custom_query_range(
                    query, _datetime(start), _datetime(at or start), f"{step}s"
                )
        except (requests.RequestException, PrometheusApiClientException, ValueError) as e:
            raise PrometheusUnavailable(f"{query}: {e}") from e
        if not isinstance(result, list) or not all(
            isinstance(r, dict) and "metric" in r and sample in r for r in result
        ):
            shape = "an instant" if sample == "value" else "a range"
            raise PrometheusUnavailable(f"{query}: not {shape} vector: {result!r:.200}")
        return result

    def now(self) -> float:
        """Prometheus's own clock: every query of one read is evaluated at this instant, so
        a bucket's steps, tokens and seconds never straddle a scrape."""
        result = self._query("vector(time())")
        if not result:
            raise PrometheusUnavailable("vector(time()): an empty answer")
        return _number(result[0]["value"][0], "evaluation time")

    def scrape_interval(self, selector: Selector, at: float | None = None) -> float | None:
        """Seconds between two scrapes of these engines: the median gap between the samples of
        their info series over the last two minutes; None before a series has two."""
        query = f"{c.ENGINE_INFO}{selector.matchers()}[120s]"
        gaps = sorted(
            _number(b[0], query) - _number(a[0], query)
            for r in self._query(query, at, sample="values")
            for a, b in itertools.pairwise(r["values"])
        )
        return gaps[len(gaps) // 2] if gaps else None

    def engines(
        self, selector: Selector, at: float | None = None, interval: float | None = None
    ) -> dict[str, EngineInfo]:
        """Pod -> info for the warm engines scraped within the staleness of `at`. Staleness and
        warm-up follow the scrape `interval` where it is longer than they allow: a fresh
        series is up to one interval old, and a counter needs two samples to increase."""
        stale, warm_up = freshness(self.stale_after, self.warm_up, interval)
        info = f"{c.ENGINE_INFO}{selector.matchers()}"
        query = f"timestamp({info})"
        if warm_up > 0:  # and: the engines up then too (matched on all labels but name)
            query += f" and {info} offset {round(warm_up * 1000)}ms"
        found = {}
        for r in self._query(query, at):
            m, (now, scraped) = r["metric"], r["value"]
            age = _number(now, "evaluation time") - _number(scraped, c.ENGINE_INFO)
            pod = m.get(selector.labels.pod)
            if pod is None or age > stale:
                continue
            simulated = m.get("simulated")
            found[pod] = EngineInfo(
                pod=pod,
                device=m.get("device", ""),
                model=m.get("model", ""),
                draft=m.get("draft", ""),
                version=m.get("version", ""),
                simulated=None if simulated is None else simulated == "true",
                age_seconds=age,
            )
        return found

    def targets(self) -> list[ScrapeTarget]:
        """Every target Prometheus discovered, active and dropped (the targets API)."""
        try:
            data = self.client.get_targets(state="any")
            return [
                *(_target(t, dropped=False) for t in data["activeTargets"]),
                *(_target(t, dropped=True) for t in data["droppedTargets"]),
            ]
        except (requests.RequestException, PrometheusApiClientException, ValueError) as e:
            raise PrometheusUnavailable(f"/api/v1/targets: {e}") from e
        except (KeyError, TypeError, AttributeError) as e:
            raise PrometheusUnavailable(f"/api/v1/targets: not a targets answer ({e!r})") from e

    def read(self, selector: Selector, window_seconds: int) -> FleetWindow:
        """Step sums per (SKU, mode, bucket), their noise, and traffic over the last
        `window_seconds`, in at most five queries: the clock, the scrape interval, the engines,
        every figure of the window in one, and its batches (none when no engine is fresh)."""
        at = self.now()
        interval = self.scrape_interval(selector, at)
        pods = self.engines(selector, at, interval)
        fresh = Selector(selector.namespace, tuple(pods), selector.labels)
        answers: dict[str, dict[tuple[str, ...], float]] = {}
        if pods:
            query = window_query(fresh, int(window_seconds))
            for r in self._query(query, at):
                name = r["metric"].get(FIGURE_LABEL)
                if (figure := FIGURES.get(name)) is not None:
                    key = tuple(r["metric"].get(label, "") for label in figure.by)
                    answers.setdefault(name, {})[key] = _number(r["value"][1], query)
        batches = self.batches(fresh, at, int(window_seconds), interval) if pods else {}
        return fleet_window(pods, window_seconds, answers, interval, batches)

    def batches(
        self, selector: Selector, at: float, window_seconds: int, interval: float | None
    ) -> dict[tuple[str, str, str], list[tuple[float, float]]]:
        """(SKU, mode, bucket) -> (tokens, seconds) of each scrape interval in the window, for
        the throughput's noise: one range query, every interval, of each counter's increase
        since the interval before. Nothing when the interval is unknown or the window holds
        fewer than MIN_BATCHES of them."""
        step = round(interval or 0)
        count = window_seconds // step if step else 0
        if count < MIN_BATCHES:
            return {}
        query = batch_query(selector, step)
        series: dict[tuple[str, str, str], dict[float, dict[str, float]]] = {}
        for r in self._query(query, at, "values", (at - (count - 1) * step, step)):
            m = r["metric"]
            key = (m.get(SKU, ""), m.get("mode", ""), m.get("batch", ""))
            for t, v in r["values"]:
                at_t = series.setdefault(key, {}).setdefault(_number(t, query), {})
                at_t[m.get(FIGURE_LABEL, "")] = _number(v, query)
        return {
            key: [(b.get("batch_tokens", 0.0), b.get("batch_seconds", 0.0)) for b in by_t.values()]
            for key, by_t in series.items()
        }


FIGURE_LABEL = "spectune_figure"  # which figure a series of the window query answers


def window_query(selector: Selector, window_seconds: int) -> str:
    """Every figure of FIGURES over these engines as one PromQL query, each aggregated there
    and told apart by the FIGURE_LABEL it carries."""
    return " or ".join(
        _tagged(figure_query(f, selector, window_seconds), name) for name, f in FIGURES.items()
    )


def batch_query(selector: Selector, step: int) -> str:
    """BATCH_FIGURES over these engines, each counter's increase since `step` seconds before
    (the last sample then and now: consecutive evaluations split the samples, none counted
    twice; a reset, a restarted pod, drops out), summed by SKU, mode and bucket."""
    parts = []
    for name, f in BATCH_FIGURES.items():
        own = ",".join((selector.labels.pod, *c.own_labels(f.metric)))
        now = f"max by ({own}) ({f.metric}{selector.matchers()})"
        then = f"max by ({own}) ({f.metric}{selector.matchers()} offset {step}s)"
        joined = _with_sku(f"(({now} - {then}) >= 0)", selector)
        parts.append(_tagged(f"sum by ({','.join(f.by)}) ({joined})", name))
    return " or ".join(parts)


def _tagged(query: str, figure: str) -> str:
    return f'label_replace({query}, "{FIGURE_LABEL}", "{figure}", "", "")'


def _with_sku(per_pod: str, selector: Selector) -> str:
    """Per-pod series with each pod's SKU: a join with its info series, since the step series
    do not carry it."""
    pod, info = selector.labels.pod, f"{c.ENGINE_INFO}{selector.matchers()}"
    return f"{per_pod} * on ({pod}) group_left ({SKU}) group by ({pod},{SKU}) ({info})"


def figure_query(figure: Figure, selector: Selector, window_seconds: int) -> str:
    """One figure as PromQL. Each pod's series are first reduced to one per pod and engine
    label set (`max by` them): a pod that two jobs scrape counts once. The SKU comes from the
    pod's info series (`_with_sku`)."""
    pod, w = selector.labels.pod, f"[{window_seconds}s]"
    series = f"{figure.metric}{selector.matchers()}{w}"
    if figure.kind in ("mean", "total"):
        per_pod = f"max by ({pod}) (avg_over_time({series}))"
        return f"{'avg' if figure.kind == 'mean' else 'sum'}({per_pod})"
    own = ",".join((pod, *c.own_labels(figure.metric)))
    per_pod = f"max by ({own}) (increase({series}))"
    if figure.kind == "p95":
        return f"histogram_quantile({E2E_QUANTILE}, sum by (le) ({per_pod}))"
    if SKU in figure.by:
        per_pod = _with_sku(per_pod, selector)
    return f"sum by ({','.join(figure.by)}) ({per_pod})"


def _target(t: Mapping[str, Any], dropped: bool) -> ScrapeTarget:
    return ScrapeTarget(
        pool=str(t.get("scrapePool", "")),
        labels=dict(t.get("labels") or {}),
        discovered=dict(t["discoveredLabels"]),
        health=str(t.get("health", "unknown")),
        error=str(t.get("lastError", "")),
        dropped=dropped,
    )


def _datetime(unix: float) -> datetime:
    return datetime.fromtimestamp(unix, UTC)


def _number(value: Any, what: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError) as e:
        raise PrometheusUnavailable(f"{what}: not a number: {value!r}") from e
