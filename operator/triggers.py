"""When to re-measure the crossover, and how far to move the threshold: pure change detection
and damping (DESIGN.md, "Re-measuring the crossover on live traffic").

Each trigger compares what the last calibration saw with what is true now and returns a
`Reason` a human can read (it goes into Events and status) or None. Unknown inputs (None, an
empty SKU set while pods start) never fire a trigger: missing data is not a change. `now` is
always a parameter, so every decision here is reproducible in a test.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Literal

from spectune.engine.contract import BATCH_BUCKETS, batch_bucket
from spectune.engine.crossover import ModeStats, StatsByBucket
from spectune.operator.estimator import MIN_STEPS
from spectune.operator.models import SpecDeploymentSpec

# Initial: nothing measured yet (a new SpecDeployment, or Manual switched to Auto).
TriggerKind = Literal["Initial", "Replicas", "Sku", "Traffic", "MaxAge", "Spec"]


@dataclass(frozen=True)
class Reason:
    """Why a calibration starts: `kind` labels metrics, `message` is for people."""

    kind: TriggerKind
    message: str


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
    admitted_concurrency: float | None = None  # full-context sequences KV admits, all pods
    e2e_p95_seconds: float | None = None  # end-to-end request latency, 95th percentile
    inter_token_seconds: float | None = None  # summed gaps between streamed tokens
    inter_tokens: float | None = None  # how many gaps

    @property
    def request_rate(self) -> float | None:
        return None if self.requests is None else self.requests / self.seconds

    @property
    def judged_requests(self) -> float | None:
        """Requests the engines answered or refused: not those a client abandoned (outcome
        error, with engine failures) or sent invalid, which no threshold decides (a load
        generator that stops clients mid-request made a tenth of a window's requests errors)."""
        if self.ok_requests is None or self.rejected_requests is None:
            return None
        return self.ok_requests + self.rejected_requests

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


# The traffic signals a shift is judged on: the crossover moves with each of them.
TRAFFIC_SIGNALS = {
    "request rate": "request_rate",
    "prompt tokens per request": "prompt_tokens_per_request",
    "output tokens per request": "tokens_per_request",
    "acceptance rate": "acceptance",
}


def replicas_changed(before: int, now: int) -> Reason | None:
    if before == now:
        return None
    return Reason("Replicas", f"replicas changed from {before} to {now}")


def skus_changed(before: frozenset[str], now: frozenset[str]) -> Reason | None:
    """The GPU SKUs under the pods (node labels or the engines' `device` label). An empty
    set is unknown (no pod placed or scraped yet), not a change."""
    if not before or not now or before == now:
        return None
    return Reason("Sku", f"GPU SKUs changed from {_names(before)} to {_names(now)}")


def _names(skus: frozenset[str]) -> str:
    return ", ".join(sorted(skus))


@dataclass(frozen=True)
class SpecKey:
    """The spec fields whose change moves the speedup curve itself."""

    model: str
    draft: str | None
    method: str
    k: int

    @classmethod
    def of(cls, spec: SpecDeploymentSpec) -> SpecKey:
        s = spec.speculation
        return cls(spec.model.name, s.draft, s.method, s.numSpeculativeTokens)


def spec_changed(before: SpecKey, now: SpecKey) -> Reason | None:
    changes = [
        f"{f.name} {getattr(before, f.name)} -> {getattr(now, f.name)}"
        for f in fields(SpecKey)
        if getattr(before, f.name) != getattr(now, f.name)
    ]
    return Reason("Spec", "spec changed: " + ", ".join(changes)) if changes else None


def too_old(measured_at: datetime, now: datetime, max_age: timedelta) -> Reason | None:
    """Re-check anyway after `max_age`: drift no trigger watches still gets caught."""
    age = now - measured_at
    if age < max_age:
        return None
    return Reason(
        "MaxAge", f"last measured {_duration(age)} ago (maximum age {_duration(max_age)})"
    )


def _duration(d: timedelta) -> str:
    s = int(d.total_seconds())
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def traffic_shifted(
    baseline: Traffic, recent: Sequence[Traffic], percent: float, windows: int = 3
) -> Reason | None:
    """Signals that moved more than `percent` from the baseline, in the same direction, in
    each of the last `windows` windows; the message names every one (longer prompts also slow
    the request rate: which moved tells what changed). One noisy window, or noise within the
    percent, never fires; a window where the signal is unknown breaks the run."""
    if len(recent) < windows:
        return None
    last = recent[-windows:]
    moved = []
    for label, attr in TRAFFIC_SIGNALS.items():
        base = getattr(baseline, attr)
        if base is None or base <= 0:
            continue
        values = [getattr(w, attr) for w in last]
        if any(v is None for v in values):
            continue
        changes = [(v - base) / base * 100 for v in values]
        if all(c > percent for c in changes) or all(c < -percent for c in changes):
            median = sorted(values)[len(values) // 2]
            moved.append(
                f"{label} moved by at least {min(changes, key=abs):+.0f}% "
                f"({base:.3g} -> {median:.3g})"
            )
    if not moved:
        return None
    return Reason(
        "Traffic",
        f"{'; '.join(moved)} over {windows} windows, beyond the {percent:g}% trafficChangePercent",
    )


def past_bound(
    bounds: Mapping[str, int],
    steps: Mapping[str, StatsByBucket],
    share: float = 0.5,
    min_steps: int = MIN_STEPS,
) -> Reason | None:
    """Where speculation paid at every batch the last calibration measured, its threshold
    stops speculation where the measured range ended and the crossover lies somewhere above.
    Once most of a window's decode steps on that SKU run at or past that batch (at least
    `min_steps` of them), the load has come round to the batches still unmeasured."""
    for sku, bound in sorted(bounds.items()):
        part = _share_of_steps(steps.get(sku, {}), lambda b, n=bound: b >= n, share, min_steps)
        if part is not None:
            return Reason(
                "Traffic",
                f"{sku}: {part:.0%} of decode steps ran at batch {bound} or more, past "
                "the batches where speculation was measured to pay",
            )
    return None


def below_floor(
    floors: Mapping[str, int],
    steps: Mapping[str, StatsByBucket],
    share: float = 0.5,
    min_steps: int = MIN_STEPS,
) -> Reason | None:
    """past_bound's mirror: where speculation paid at no batch the last calibration measured,
    its threshold turns speculation off only from the smallest batch measured, and smaller
    batches still speculate unmeasured. Once most of a window's decode steps on that SKU run
    below it, the load has come down to them."""
    for sku, floor in sorted(floors.items()):
        part = _share_of_steps(steps.get(sku, {}), lambda b, n=floor: b < n, share, min_steps)
        if part is not None:
            return Reason(
                "Traffic",
                f"{sku}: {part:.0%} of decode steps ran below batch {floor}, under the "
                "batches where speculation was measured not to pay",
            )
    return None


def _share_of_steps(
    stats: StatsByBucket, where: Callable[[int], bool], share: float, min_steps: int
) -> float | None:
    """The share of a window's decode steps in the buckets `where` picks, when that is at
    least `share` of them and `min_steps` in number; else None."""
    total = sum(s.steps for s in stats.values())
    picked = sum(s.steps for (_, bucket), s in stats.items() if where(bucket))
    return picked / total if picked >= min_steps and picked >= share * total else None


def clamp(threshold: int | None, low: int, high: int) -> int:
    """Within the spec's threshold.min/max. None (speculate at every batch size) counts as
    above any max, so it becomes `high`; 0 (never speculate) below a positive min."""
    return high if threshold is None else max(low, min(high, threshold))


def bucket_steps(a: int | None, b: int | None) -> float:
    """How many batch buckets apart two thresholds are; 0 (never speculate) sits one bucket
    below the first, None (always speculate) infinitely far above the last."""
    if a == b:
        return 0
    return abs(_bucket_index(a) - _bucket_index(b))


def _bucket_index(threshold: int | None) -> float:
    if threshold is None:
        return math.inf
    return -1 if threshold == 0 else BATCH_BUCKETS.index(batch_bucket(threshold))


Action = Literal["change", "hold"]


@dataclass(frozen=True)
class Damped:
    """What to run: `threshold` is the current value on hold, the new one on change."""

    action: Action
    threshold: int | None
    message: str


def damp(
    current: int | None,
    measured: int | None,
    low: int,
    high: int,
    last_change: datetime | None,
    now: datetime,
    min_dwell: timedelta,
    dead_band_buckets: int = 1,
) -> Damped:
    """Move from `current` to the clamped `measured` threshold only when the move is beyond
    the dead band (the crossover is only located to within a bucket, so a one-bucket move
    is noise) and the last change is at least `min_dwell` old: the threshold never flaps.
    `current` None with no change yet means nothing was measured before: no dead band."""
    target = clamp(measured, low, high)
    if target == current:
        return Damped("hold", current, f"threshold stays at {target}")
    first = current is None and last_change is None
    if not first and bucket_steps(current, target) <= dead_band_buckets:
        return Damped(
            "hold",
            current,
            f"{current} -> {target} is within the dead band of {dead_band_buckets} bucket(s)",
        )
    if last_change is not None and now - last_change < min_dwell:
        wait = _duration(min_dwell - (now - last_change))
        return Damped("hold", current, f"{current} -> {target} waits {wait} for the minimum dwell")
    return Damped("change", target, f"threshold {current} -> {target}")


Verdict = Literal["keep", "roll_back", "unknown"]


@dataclass(frozen=True)
class GoodputCheck:
    verdict: Verdict
    message: str


def queueing_warning(before: Traffic, after: Traffic, tolerance: float = 0.1) -> str | None:
    """Speculation's memory bill: the draft's KV cache and the drafted positions take blocks,
    so fewer sequences are admitted; once that makes requests queue, end-to-end latency rises
    while each token comes faster, and token-level metrics hide what users feel. None unless
    admitted concurrency fell and p95 end-to-end latency rose (each beyond `tolerance`) while
    the mean inter-token latency fell."""
    a0, a1 = before.admitted_concurrency, after.admitted_concurrency
    p0, p1 = before.e2e_p95_seconds, after.e2e_p95_seconds
    i0, i1 = before.mean_inter_token_seconds, after.mean_inter_token_seconds
    if None in (a0, a1, p0, p1, i0, i1):
        return None
    assert a0 is not None and a1 is not None and p0 is not None and p1 is not None
    assert i0 is not None and i1 is not None
    if not (a1 < a0 * (1 - tolerance) and p1 > p0 * (1 + tolerance) and i1 < i0):
        return None
    return (
        f"admitted concurrency fell from {a0:.0f} to {a1:.0f} and p95 end-to-end latency rose "
        f"from {p0:.2f} s to {p1:.2f} s while inter-token latency improved ({i0 * 1000:.0f} -> "
        f"{i1 * 1000:.0f} ms): speculation's KV memory is making requests queue"
    )


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


@dataclass(frozen=True)
class SameMixSpeedup:
    """How much faster the after window decoded than the before window would have, on the
    after window's batch mix."""

    speedup: float
    covered: float  # the share of the after window's decode time in the compared buckets


def same_mix_speedup(
    before: ServedByBucket, after: ServedByBucket, min_steps: int = MIN_STEPS
) -> SameMixSpeedup | None:
    """For every (SKU, bucket) with `min_steps` steps in both windows: the seconds the after
    window's tokens would have taken at the before window's rate there, over the seconds they
    took. A threshold changes the mode bucket by bucket while the load moves the batch mix
    (a bigger batch decodes more tokens per second in either mode), so a fleet-wide tokens
    per busy second would mistake a load change for the threshold's effect. None when no
    bucket compares."""
    would, took, total = 0.0, 0.0, 0.0
    for sku, buckets in after.items():
        for bucket, now in buckets.items():
            total += now.seconds
            then = before.get(sku, {}).get(bucket)
            if then is None or then.throughput is None or min(then.steps, now.steps) < min_steps:
                continue
            would += now.tokens / then.throughput
            took += now.seconds
    if took <= 0:
        return None
    return SameMixSpeedup(would / took, took / total)


def compare_goodput(
    before: Traffic,
    after: Traffic,
    decode: SameMixSpeedup | None,
    z: float = 3.0,
    throughput_tolerance: float = 0.05,
    min_covered: float = 0.5,
    load_tolerance: float = 0.25,
    min_requests: int = 50,
) -> GoodputCheck:
    """Keep or roll back a threshold change, from windows before and after it.

    Two measures, each normalised for load. Decode throughput on the same batch mix
    (`same_mix_speedup`): a drop beyond `throughput_tolerance`, in buckets holding at least
    `min_covered` of the after window's decode time, rolls back whatever the load did. The
    SLO-met share of requests (goodput per request, where speculation's memory bill shows as
    queueing): a drop beyond the binomial noise of both windows (a two-proportion z-test)
    rolls back, if both windows have `min_requests` and request rates within
    `load_tolerance` of each other (a busier window misses more SLOs whatever the
    threshold). Neither measure comparable: "unknown", and the caller keeps the change (no
    evidence against it)."""
    speedup = decode.speedup if decode is not None and decode.covered >= min_covered else None
    if speedup is not None and speedup < 1 - throughput_tolerance:
        assert decode is not None
        return GoodputCheck(
            "roll_back",
            f"decode throughput on the same batch mix fell {1 - speedup:.0%} "
            f"(more than {throughput_tolerance:.0%}; buckets holding {decode.covered:.0%} "
            "of decode time compared)",
        )
    slo = _slo_share_drop(before, after, z, load_tolerance, min_requests)
    if slo is not None and slo.verdict == "roll_back":
        return slo
    if speedup is None and (slo is None or slo.verdict == "unknown"):
        why = slo.message if slo is not None else "no SLO-met share measured"
        return GoodputCheck("unknown", f"decode throughput not comparable; {why}")
    kept = "goodput did not fall beyond noise"
    if speedup is not None:
        kept += f" (decode throughput on the same batch mix x{speedup:.2f})"
    return GoodputCheck("keep", kept)


def _slo_share_drop(
    before: Traffic, after: Traffic, z: float, load_tolerance: float, min_requests: int
) -> GoodputCheck | None:
    """The SLO-met share's verdict; None when neither window measured it."""
    p0, p1 = before.slo_met_share, after.slo_met_share
    if p0 is None or p1 is None:
        return None
    n0, n1 = before.judged_requests, after.judged_requests
    assert n0 is not None and n1 is not None  # a share needs them
    if min(n0, n1) < min_requests:
        return GoodputCheck("unknown", f"too few requests to compare (need {min_requests})")
    r0, r1 = before.request_rate, after.request_rate
    assert r0 is not None and r1 is not None
    if abs(r1 - r0) > load_tolerance * r0:
        return GoodputCheck(
            "unknown", f"load changed from {r0:.3g} to {r1:.3g} requests/s: not comparable"
        )
    pooled = (p0 * n0 + p1 * n1) / (n0 + n1)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n0 + 1 / n1))
    if p1 < p0 and (p0 - p1) > z * se:
        return GoodputCheck(
            "roll_back", f"SLO-met share fell from {p0:.1%} to {p1:.1%} (beyond noise)"
        )
    return GoodputCheck("keep", "SLO-met share did not fall beyond noise")
