"""Whether a threshold change hurt: goodput before vs after it, normalised for load, and
speculation's memory bill showing as queueing. Pure.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from spectune.operator.estimator import MIN_STEPS
from spectune.operator.observations import ServedByBucket, Traffic

Verdict = Literal["keep", "roll_back", "unknown"]

# The SLO-met share's test: a fall beyond Z standard errors, in windows of MIN_REQUESTS or more
# whose request rates are within LOAD_TOLERANCE (a busier window misses more SLOs anyway).
Z, LOAD_TOLERANCE, MIN_REQUESTS = 3.0, 0.25, 50


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
    after window's batch mix, in the buckets the change flipped."""

    speedup: float
    covered: float  # the share of the flipped buckets' decode time (after) that compared
    margin: float  # the fall that is beyond noise here
    untouched: bool = False  # no step since ran in a flipped bucket: each ran its old mode


def same_mix_speedup(
    before: ServedByBucket,
    after: ServedByBucket,
    flipped: Callable[[str, int], bool],
    min_steps: int = MIN_STEPS,
    z: float = 3.0,
    floor: float = 0.05,
) -> SameMixSpeedup | None:
    """For every (SKU, bucket) the change `flipped` to the other mode with `min_steps` steps
    in both windows: the seconds the after window's tokens would have taken at the before
    window's rate there, over the seconds they took. Only those buckets: the others ran the
    same mode before and after, and what moved there is the load's doing (a bigger batch
    decodes more tokens per second in either mode, and a longer context fewer), not the
    change's. Those others give the noise instead: the spread of their after/before rates,
    per step, scaled to the flipped buckets' steps, sets the `margin` (at least `floor`; just
    `floor` with fewer than two to learn from). A bucket that decoded no tokens before has no
    rate to compare with and is left out. When the after window decoded, but in no flipped
    bucket, every step ran the mode it ran before: `untouched`, a speedup of 1 by construction
    (a threshold moved among batches the traffic does not make). None when the after window
    decoded nothing, or its flipped buckets do not compare."""
    would, took, flipped_seconds = 0.0, 0.0, 0.0
    weights: list[tuple[float, float]] = []  # flipped: (seconds, 1/n before + 1/n after)
    spread, variance = 0.0, 0.0  # unflipped: sum of squared log ratios, and of 1/n + 1/n
    controls = 0
    for sku, buckets in after.items():
        for bucket, now in buckets.items():
            flips = flipped(sku, bucket)
            flipped_seconds += now.seconds if flips else 0.0
            then = before.get(sku, {}).get(bucket)
            rate = then.throughput if then is not None else None
            if not rate or min(then.steps, now.steps) < min_steps or now.seconds <= 0:
                continue  # no rate, or none decoded
            per_step = 1 / then.steps + 1 / now.steps
            if flips:
                would += now.tokens / rate
                took += now.seconds
                weights.append((now.seconds, per_step))
            elif now.tokens > 0:
                spread += math.log(now.throughput / rate) ** 2
                variance += per_step
                controls += 1
    if flipped_seconds <= 0 and any(s.seconds > 0 for b in after.values() for s in b.values()):
        return SameMixSpeedup(1.0, 1.0, floor, untouched=True)
    if took <= 0:
        return None
    margin = floor
    if controls >= 2 and variance > 0:
        noise = spread / variance  # squared relative noise of one step's rate
        se = math.sqrt(noise * sum((t / took) ** 2 * v for t, v in weights))
        margin = max(floor, 1 - math.exp(-z * se))
    return SameMixSpeedup(would / took, took / flipped_seconds, margin)


def compare_goodput(
    before: Traffic,
    after: Traffic,
    decode: SameMixSpeedup | None,
    history: Sequence[Traffic] = (),
    z: float = Z,
    min_covered: float = 0.5,
    load_tolerance: float = LOAD_TOLERANCE,
    min_requests: int = MIN_REQUESTS,
    speculates_less: bool = False,
) -> GoodputCheck:
    """Keep or roll back a threshold change, from windows before and after it.

    Two measures, each normalised for load. Decode throughput on the same batch mix in the
    buckets the change flipped (`same_mix_speedup`): a fall beyond its noise margin, in
    buckets holding at least `min_covered` of those buckets' decode time, rolls back whatever
    the load did. The SLO-met share of requests (goodput per request, where speculation's
    memory bill shows as queueing): a fall rolls back if it is beyond the binomial noise of
    both windows (a two-proportion z-test) and beyond every move the share made between
    consecutive windows of `history` (the windows before the change, oldest first: traffic
    that bursts or climbs moves the share by itself, and requests in one burst miss together),
    with both windows holding `min_requests` and request rates within `load_tolerance` (a busier
    window misses more SLOs whatever the threshold). A change that `speculates_less` (turns
    speculation off at some batches, on at none) frees the draft's memory instead: the share
    can fall only through the flipped buckets' decode, so where that compared, the share does
    not judge it. Neither measure comparable: "unknown".
    """
    usable = decode is not None and decode.covered >= min_covered
    speedup = decode.speedup if decode is not None and usable else None
    if decode is not None and speedup is not None and speedup < 1 - decode.margin:
        return GoodputCheck(
            "roll_back",
            f"decode throughput on the same batch mix fell {1 - speedup:.0%} in the buckets the "
            f"change flipped (more than the {decode.margin:.0%} their noise allows; "
            f"{decode.covered:.0%} of their decode time compared)",
        )
    slo = slo_share_drop(before, after, history, z, load_tolerance, min_requests)
    if slo is not None and slo.verdict == "roll_back" and not (speculates_less and usable):
        return slo
    if speedup is None and (slo is None or slo.verdict == "unknown"):
        why = slo.message if slo is not None else "no SLO-met share measured"
        return GoodputCheck("unknown", f"decode throughput not comparable; {why}")
    kept = "goodput did not fall beyond noise"
    if decode is not None and decode.untouched:
        kept += " (no batch since ran in a bucket the change flipped)"
    elif speedup is not None:
        kept += f" (decode throughput on the same batch mix x{speedup:.2f} where it flipped)"
    return GoodputCheck("keep", kept)


def slo_share_drop(
    before: Traffic,
    after: Traffic,
    history: Sequence[Traffic],
    z: float = Z,
    load_tolerance: float = LOAD_TOLERANCE,
    min_requests: int = MIN_REQUESTS,
    since: str = "the change",
) -> GoodputCheck | None:
    """The SLO-met share's verdict (compare_goodput's second measure: "roll_back" where it
    fell beyond noise, from `before` to `after`, `since` naming what came between); None when
    neither window measured it; "unknown" where admission was limited already before
    (`Traffic.admission_limited`: the share is then what admission let through, whatever the
    threshold; a fleet the change itself brought to refuse or queue requests is judged)."""
    p0, p1 = before.slo_met_share, after.slo_met_share
    if p0 is None or p1 is None:
        return None
    if before.admission_limited:
        return GoodputCheck(
            "unknown",
            "requests were refused or queued for admission already before: the SLO-met share "
            "is what admission let through, not the threshold's doing",
        )
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
    shares = [s for t in history if (s := t.slo_met_share) is not None]
    moved = max((abs(b - a) for a, b in itertools.pairwise(shares)), default=0.0)
    if p1 < p0 and (p0 - p1) > max(z * se, moved):
        also = (
            f", and beyond the {moved:.1%} it moved between the windows before {since}"
            if len(shares) > 1
            else ""
        )
        fell = f"SLO-met share fell from {p0:.1%} to {p1:.1%} (beyond noise{also})"
        return GoodputCheck("roll_back", fell)
    return GoodputCheck("keep", "SLO-met share did not fall beyond noise")
