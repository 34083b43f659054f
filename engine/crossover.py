"""The crossover: the batch size where speculation stops paying, and what to do about it.

Pure and torch-free, so the operator can make the same decisions from Prometheus data
that the bench makes from its own sweeps. Throughput of a mode at a batch bucket is
tokens / seconds summed over its decode iterations, exactly
rate(step_output_tokens_total) / rate(step_seconds_sum) (see contract.py); the
speedup is spec throughput over plain throughput; the crossover is where it falls
through 1.0.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from spectune.engine.contract import BATCH_BUCKETS, batch_bucket

CrossoverStatus = Literal["crosses", "never_pays", "always_pays", "unknown"]


class StepRecord(Protocol):
    """One decode iteration, as the engine's `Iteration` records it."""

    mode: str
    batch_size: int
    tokens: int
    seconds: float


@dataclass(frozen=True)
class ModeStats:
    """Decode iterations of one mode in one batch bucket, summed."""

    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def __add__(self, other: ModeStats) -> ModeStats:
        return ModeStats(
            self.steps + other.steps, self.tokens + other.tokens, self.seconds + other.seconds
        )

    def __sub__(self, other: ModeStats) -> ModeStats:
        return ModeStats(
            self.steps - other.steps, self.tokens - other.tokens, self.seconds - other.seconds
        )

    @property
    def throughput(self) -> float | None:
        """Tokens per second; None without data (missing is unknown, not zero)."""
        return self.tokens / self.seconds if self.steps and self.seconds > 0 else None

    @property
    def step_seconds(self) -> float | None:
        return self.seconds / self.steps if self.steps else None

    @property
    def tokens_per_step(self) -> float | None:
        return self.tokens / self.steps if self.steps else None


StatsByBucket = dict[tuple[str, int], ModeStats]  # (mode, bucket) -> stats


@dataclass(frozen=True)
class SpeedupPoint:
    batch: int  # the bucket
    plain: ModeStats
    spec: ModeStats

    @property
    def speedup(self) -> float:
        assert self.plain.throughput and self.spec.throughput
        return self.spec.throughput / self.plain.throughput

    @property
    def mean_batch(self) -> float:
        """The mean batch size behind the bucket's measurements: a plain step commits one token
        per sequence, so its tokens per step is the batch (the bucket itself in a batch sweep).
        Placing the point there rather than at the bucket's lower edge removes a bias of up to
        a third of a bucket toward small batches under live traffic."""
        return self.plain.tokens_per_step or self.batch


@dataclass(frozen=True)
class Crossover:
    status: CrossoverStatus
    # crosses: the interpolated batch size where speedup = 1.0; always_pays: the largest
    # measured batch (the crossover lies above it); never_pays: the smallest (it lies below)
    batch: float | None = None

    @property
    def threshold(self) -> int | None:
        """The gate threshold to set (speculate while batch < threshold): None means always
        speculate, 0 never. Speculation pays below the crossover, so the first batch size at
        or above it is where the gate turns it off."""
        if self.status == "unknown":
            raise ValueError("no threshold: no batch bucket was measured in both modes")
        if self.status == "crosses":
            assert self.batch is not None
            return max(1, math.ceil(self.batch))
        return 0 if self.status == "never_pays" else None

    @property
    def bucket_index(self) -> int | None:
        """Position among BATCH_BUCKETS: a crossover beyond the measured range sits one
        bucket past it; None when unknown."""
        if self.status == "unknown" or self.batch is None:
            return None
        index = BATCH_BUCKETS.index(batch_bucket(max(1, math.floor(self.batch))))
        return index + {"crosses": 0, "always_pays": 1, "never_pays": -1}[self.status]


def aggregate(records: Iterable[StepRecord]) -> StatsByBucket:
    """Sum decode iterations per (mode, bucket); prefill iterations are not decode steps."""
    stats: StatsByBucket = {}
    for r in records:
        if r.mode not in ("spec", "plain"):
            continue
        key = (r.mode, batch_bucket(r.batch_size))
        stats[key] = stats.get(key, ModeStats()) + ModeStats(1, r.tokens, r.seconds)
    return stats


def aggregate_median(records: Iterable[StepRecord]) -> StatsByBucket:
    """Like `aggregate`, but each bucket's time is its median step time x its steps, so a
    few steps slowed by other work on the machine cannot move it. For sweeps that time
    steps directly; rates from Prometheus can only give `aggregate`'s sums."""
    groups: dict[tuple[str, int], list[StepRecord]] = {}
    for r in records:
        if r.mode in ("spec", "plain"):
            groups.setdefault((r.mode, batch_bucket(r.batch_size)), []).append(r)
    return {
        key: ModeStats(
            len(rs), sum(r.tokens for r in rs), statistics.median(r.seconds for r in rs) * len(rs)
        )
        for key, rs in groups.items()
    }


def difference(after: StatsByBucket, before: StatsByBucket) -> StatsByBucket:
    """What happened between two cumulative snapshots (counters only grow)."""
    return {
        key: delta
        for key, value in after.items()
        if (delta := value - before.get(key, ModeStats())).steps > 0
    }


def merge(parts: Iterable[StatsByBucket]) -> StatsByBucket:
    total: StatsByBucket = {}
    for part in parts:
        for key, value in part.items():
            total[key] = total.get(key, ModeStats()) + value
    return total


def speedup_curve(
    stats: Mapping[tuple[str, int], ModeStats], min_steps: int = 1
) -> list[SpeedupPoint]:
    """Buckets where both modes have at least `min_steps` timed iterations, ascending."""
    points = []
    for bucket in BATCH_BUCKETS:
        plain, spec = stats.get(("plain", bucket)), stats.get(("spec", bucket))
        if not plain or not spec or min(plain.steps, spec.steps) < min_steps:
            continue
        if plain.throughput and spec.throughput:
            points.append(SpeedupPoint(bucket, plain, spec))
    return points


def find_crossover(points: Sequence[tuple[float, float]], gain: float = 0.0) -> Crossover:
    """(batch, speedup) pairs, ascending in batch → where speculation stops paying (by
    `gain` or more: where speedup falls to 1 + gain).

    A threshold gate speculates on a prefix of batch sizes, so the prefix to pick is the
    one whose speedups multiply to the most (each measured bucket weighs the same). For
    a speedup that falls steadily that is exactly where it crosses 1.0; on a noisy curve
    an isolated dip below 1.0 or bump above it does not move the answer. The crossover
    is interpolated linearly between the last bucket of the prefix and the next one."""
    if not points:
        return Crossover("unknown")
    par = 1.0 + gain
    gains = list(itertools.accumulate((math.log(s / par) for _, s in points), initial=0.0))
    best = max(range(len(gains)), key=lambda m: (gains[m], -m))  # ties: speculate less
    if best == 0:
        return Crossover("never_pays", points[0][0])
    if best == len(points):
        return Crossover("always_pays", points[-1][0])
    (b0, s0), (b1, s1) = points[best - 1], points[best]
    return Crossover("crosses", b0 + (s0 - par) / (s0 - s1) * (b1 - b0))


def crossover_of(curve: Sequence[SpeedupPoint], gain: float = 0.0) -> Crossover:
    return find_crossover([(p.mean_batch, p.speedup) for p in curve], gain)


def bucket_distance(a: Crossover, b: Crossover) -> int | None:
    """How many batch buckets apart two crossovers are; None if either is unknown."""
    if a.bucket_index is None or b.bucket_index is None:
        return None
    return abs(a.bucket_index - b.bucket_index)


@dataclass(frozen=True)
class LevelVerdict:
    load: float
    ratio: float | None  # gated / the better of never and always; None when both are 0


@dataclass(frozen=True)
class Verdict:
    """The central claim: gated goodput >= `floor` x the better of never/always at every load
    level, and higher than each of them summed over the sweep."""

    levels: list[LevelVerdict]
    totals: dict[str, float]
    floor: float

    @property
    def min_ratio(self) -> float | None:
        known = [v.ratio for v in self.levels if v.ratio is not None]
        return min(known) if known else None

    @property
    def holds(self) -> bool:
        every = all(v.ratio is None or v.ratio >= self.floor for v in self.levels)
        gated = self.totals["gated"]
        return every and gated > self.totals["never"] and gated > self.totals["always"]


def judge_gate(goodput: Mapping[str, Mapping[float, float]], floor: float = 0.97) -> Verdict:
    """goodput[policy][load] for policies never, always, gated over the same loads."""
    loads = sorted(goodput["gated"])
    levels = []
    for load in loads:
        best = max(goodput["never"][load], goodput["always"][load])
        levels.append(LevelVerdict(load, goodput["gated"][load] / best if best > 0 else None))
    totals = {p: sum(goodput[p][load] for load in loads) for p in ("never", "always", "gated")}
    return Verdict(levels, totals, floor)
