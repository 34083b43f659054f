"""What the operator observes of a fleet: the types the Prometheus reader returns and the
state machine decides on. A leaf module (no I/O, no client libraries), so that both import it
and neither imports the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from spectune.engine.crossover import ModeStats, StatsByBucket

# The share of requests refused beyond which a window's admission, not its threshold, decided
# what it served (Traffic.admission_limited).
ADMISSION_LIMITED_SHARE = 0.02


class MetricsUnavailable(Exception):
    """The metrics store could not be asked or gave an answer that is not a query result."""


@dataclass(frozen=True)
class LabelNames:
    """Target label names for the engines' namespace and pod: what every pod scrape carries
    (the Prometheus Operator's and Kubernetes pod discovery's usual names by default)."""

    namespace: str = "namespace"
    pod: str = "pod"


@dataclass(frozen=True)
class Traffic:
    """What the fleet's engines did over one window, summed over fresh pods. None is unknown
    (no series), never zero; the properties are None whenever an input is."""

    seconds: float
    requests: float | None = None  # finished requests, every outcome
    slo_met: float | None = None
    ok_requests: float | None = None
    rejected_requests: float | None = None  # refused: the admission queue was full
    prompt_tokens: float | None = None  # of the successful requests
    decode_tokens: float | None = None  # committed by decode iterations, both modes
    drafted_tokens: float | None = None
    accepted_tokens: float | None = None
    mean_running: float | None = None  # running batch, averaged over time and pods
    mean_waiting: float | None = None  # requests waiting for admission, averaged, all pods
    admitted_concurrency: float | None = None  # full-context sequences KV admits, all pods
    e2e_p95_seconds: float | None = None  # end-to-end request latency, 95th percentile
    inter_token_seconds: float | None = None  # summed gaps between streamed tokens
    inter_tokens: float | None = None  # how many gaps
    engines: float | None = None  # the fresh engines the window sums over

    @property
    def request_rate(self) -> float | None:
        return None if self.requests is None else self.requests / self.seconds

    @property
    def request_rate_per_engine(self) -> float | None:
        """What each engine serves: the load a threshold sees. A rise that an HPA absorbs by
        adding replicas leaves it where it was."""
        return _ratio(self.request_rate, self.engines)

    @property
    def judged_requests(self) -> float | None:
        """Requests the engines answered or refused: not those a client abandoned (outcome
        cancelled), the engine failed (error) or a client sent invalid, which no threshold
        decides (a load generator that stops clients mid-request made a tenth of a window's
        requests cancelled)."""
        if self.ok_requests is None or self.rejected_requests is None:
            return None
        return self.ok_requests + self.rejected_requests

    @property
    def admission_limited(self) -> bool | None:
        """Whether admission, not the threshold, decided what this window served: requests
        refused (a full queue) beyond ADMISSION_LIMITED_SHARE of those judged, or requests
        waiting to be admitted (KV full) beyond one an engine on average. What such a window
        finished, and how many of those met the SLO, is what admission let through: its
        traffic mix and SLO-met share say nothing of the threshold. Its decode steps still do.
        None: unknown."""
        rejected, judged = self.rejected_requests, self.judged_requests
        refused = None if rejected is None or not judged else rejected / judged
        queued = _ratio(self.mean_waiting, self.engines)
        if refused is None and queued is None:
            return None
        return (refused or 0.0) > ADMISSION_LIMITED_SHARE or (queued or 0.0) > 1.0

    @property
    def slo_met_share(self) -> float | None:
        """Share of the judged requests within the SLO: goodput normalised for load."""
        return _ratio(self.slo_met, self.judged_requests)

    @property
    def prompt_tokens_per_request(self) -> float | None:
        """Mean prompt length of the successful requests: the context a sequence starts with."""
        return _ratio(self.prompt_tokens, self.ok_requests)

    @property
    def tokens_per_request(self) -> float | None:
        """Decode tokens per successful request: a stand-in for output length."""
        return _ratio(self.decode_tokens, self.ok_requests)

    @property
    def acceptance(self) -> float | None:
        return _ratio(self.accepted_tokens, self.drafted_tokens)

    @property
    def mean_inter_token_seconds(self) -> float | None:
        return _ratio(self.inter_token_seconds, self.inter_tokens)


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None or den <= 0 else num / den


@dataclass(frozen=True)
class EngineInfo:
    """One engine as its `spectune_engine_info` says; `device` is the SKU key."""

    pod: str
    device: str
    model: str
    draft: str
    version: str
    simulated: bool | None  # None: the engine does not say
    age_seconds: float  # since the last scrape of its info series


# SKU -> (mode, bucket) -> the relative standard error of the window's throughput there
NoiseBySku = Mapping[str, Mapping[tuple[str, int], float]]


@dataclass(frozen=True)
class FleetWindow:
    """What one SpecDeployment's fresh engines did over a window."""

    engines: Mapping[str, EngineInfo]  # pod -> info
    steps: Mapping[str, StatsByBucket]  # device (SKU) -> (mode, bucket) -> sums
    traffic: Traffic
    scrape_interval: float | None = None  # seconds between two scrapes; None: not seen yet
    # measured from the window's batches (one scrape interval each); a (mode, bucket) with too
    # few batches to tell is absent
    noise: NoiseBySku = field(default_factory=dict)

    @property
    def skus(self) -> frozenset[str]:
        return frozenset(e.device for e in self.engines.values())


ServedByBucket = Mapping[str, Mapping[int, ModeStats]]  # SKU -> batch bucket -> both modes


def served(steps: Mapping[str, StatsByBucket]) -> dict[str, dict[int, ModeStats]]:
    """A window's decode steps per SKU and bucket, both modes summed: what the fleet ran
    under its thresholds, whichever mode each step took."""
    out: dict[str, dict[int, ModeStats]] = {}
    for sku, stats in steps.items():
        buckets = out.setdefault(sku, {})
        for (_, bucket), s in stats.items():
            buckets[bucket] = buckets.get(bucket, ModeStats()) + s
    return out
