"""Whether a threshold change hurt: goodput before vs after it, normalised for load, and
speculation's memory bill showing as queueing. Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from spectune.operator.estimator import MIN_STEPS
from spectune.operator.observations import ServedByBucket, Traffic

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
    per busy second would mistake a load change for the threshold's effect. A bucket that
    decoded no tokens before has no rate to compare with and is left out. None when no
    bucket compares."""
    would, took, total = 0.0, 0.0, 0.0
    for sku, buckets in after.items():
        for bucket, now in buckets.items():
            total += now.seconds
            then = before.get(sku, {}).get(bucket)
            rate = then.throughput if then is not None else None
            if not rate or min(then.steps, now.steps) < min_steps:  # no rate, or none decoded
                continue
            would += now.tokens / rate
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
