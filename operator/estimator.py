"""The crossover estimated from live traffic, per GPU SKU. Pure: the Prometheus reader gives
per (mode, batch bucket) sums of decode iterations over a window; the curve and the
crossover come from engine/crossover.py, the same math the bench uses.

Throughput per bucket is tokens over busy seconds (the sums), not a median from the step
histogram: its buckets are 1.3-2x apart, so an interpolated median can be off by more than
the few percent of speedup that separate neighbouring batch buckets near the crossover.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from spectune.engine.contract import BATCH_BUCKETS
from spectune.engine.crossover import (
    Crossover,
    ModeStats,
    SpeedupPoint,
    crossover_of,
    speedup_curve,
)

# Steps per mode in a bucket for a bucket's throughput to count as measured; the explored
# mode gets only a few percent of the iterations, so this is what calibration waits for.
MIN_STEPS = 20
# A bucket holding less than this share of a SKU's decode steps does not hold a calibration up:
# it moves goodput by little whichever mode it runs, and sampling it in both modes can take
# several windows (a quiet load of 3 clients: batch 1 in under 1% of the steps, 10 per mode in
# 120 s, kept the demo's first calibration to its window's end).
RARE_SHARE = 0.05
# The noise of one decode step's throughput, as a share of it, assumed where the window's
# batches do not measure it (too few scrapes): the mean of n steps has 1/sqrt(n) of it.
STEP_NOISE = 0.1
# A bucket whose speedup is this many standard errors from 1, and at least CLEAR_FLOOR from it,
# is clearly measured: a threshold move that flips its mode is made even within the dead band.
# The floor stands for what the noise does not hold (the bias of a bucket's mean batch, say).
CLEAR_Z = 3.0
CLEAR_FLOOR = 0.05
# Full confidence: the deciding buckets' speedups known to CLEAR_FLOOR / CLEAR_Z (a 5% step in
# speedup is three standard errors). Confidence is that over the larger relative error.
CONFIDENT_SE = CLEAR_FLOOR / CLEAR_Z


@dataclass(frozen=True)
class Estimate:
    """The crossover of one SKU and the evidence for it."""

    sku: str
    crossover: Crossover
    curve: tuple[SpeedupPoint, ...]
    largest_batch_seen: int | None  # the largest bucket with decode steps in either mode
    reason: str
    noise: Mapping[int, float] = field(default_factory=dict)  # bucket -> speedup's relative SE

    @property
    def noisiest(self) -> tuple[SpeedupPoint, float] | None:
        """The bucket deciding the crossover whose speedup is least certain, and its relative
        standard error (None without a curve)."""
        points = _deciding(self.crossover, self.curve)
        return max(((p, self.noise[p.batch]) for p in points), key=lambda x: x[1], default=None)

    @property
    def dead_band(self) -> int:
        """Threshold buckets a move must go beyond: one (the crossover is located to within a
        bucket), or as many as a standard error of the crossover spans where that is more
        (buckets sit about sqrt(2) apart). The crossing is interpolated between the deciding
        buckets, so their speedups' errors move it: more, the flatter the curve there."""
        if self.crossover.status != "crosses" or self.crossover.batch is None:
            return 1
        (low, high), x = _deciding(self.crossover, self.curve), self.crossover.batch
        drop, width = low.speedup - high.speedup, high.mean_batch - low.mean_batch
        moved_by_low = width * (1 - high.speedup) / drop**2 * low.speedup * self.noise[low.batch]
        moved_by_high = width * (low.speedup - 1) / drop**2 * high.speedup * self.noise[high.batch]
        error = math.hypot(moved_by_low, moved_by_high)
        return max(1, math.ceil(2 * math.log2((x + error) / x)))

    @property
    def confidence(self) -> float:
        """0..1: CONFIDENT_SE over the noisiest deciding bucket's relative error, at most 1
        (1/3 when a 15% step in speedup is only three standard errors). Noise measured as
        exactly zero (deterministic step times) is full confidence."""
        noisiest = self.noisiest
        if noisiest is None:
            return 0.0
        return 1.0 if noisiest[1] <= CONFIDENT_SE else CONFIDENT_SE / noisiest[1]

    @property
    def known(self) -> bool:
        return self.crossover.status != "unknown"

    @property
    def threshold(self) -> int | None:
        """The gate threshold the estimate asks for (see Crossover.threshold), except at the
        edges of what the window measured. Speedup falls as the batch grows, so a curve above 1
        in every measured bucket says nothing of larger batches: speculation runs through the
        largest measured bucket and stops at the next (a trigger re-measures once traffic runs
        there). Alike, a curve below 1 from its first measured bucket turns speculation off
        only from that bucket up (`off_from`): not paying at 32 says nothing against 16. And
        speculation never runs where a clear loss bounds it below 1 (`_loss_bound`): a bump
        above 1 past a clear loss is noise, since speedup falls as the batch grows."""
        if self.crossover.status == "never_pays":
            return self.off_from
        asked = self.bound if self.crossover.status == "always_pays" else self.crossover.threshold
        losing = self.losing
        if losing is None:
            return asked
        cap = max(1, math.ceil(_loss_bound(losing, self.noise)))
        return asked if asked is not None and asked <= cap else cap

    @property
    def bound(self) -> int | None:
        """For a curve that pays in every measured bucket: the batch where the measured range
        ends (the next bucket's lower edge), None past the last bucket or for other curves."""
        return _bound(self.crossover, self.curve)

    @property
    def off_from(self) -> int:
        """For a curve that pays in no measured bucket: the batch from which its threshold turns
        speculation off (`_off_from`)."""
        return _off_from(self.curve, self.noise)

    @property
    def loses_from(self) -> int | None:
        """The batch from which speculation clearly loses, by the `losing` bucket (`_loses_from`);
        None where no bucket clearly loses. Speedup falls as the batch grows, so exploring
        speculation from there up measures nothing a crossover or a bound still needs, at the
        highest price an explored iteration has."""
        losing = self.losing
        return None if losing is None else _loses_from(losing, self.noise)

    @property
    def losing(self) -> SpeedupPoint | None:
        """The smallest measured bucket whose speedup is clearly below 1, or None."""
        return next((p for p in self.curve if self.clearly(p, pays=False)), None)

    def clearly(self, point: SpeedupPoint, pays: bool) -> bool:
        """Whether a bucket of this curve clearly pays (`pays`), or clearly loses, beyond its
        noise."""
        return (point.speedup > 1) == pays and clearly_not_one(point, self.noise.get(point.batch))

    @property
    def floor(self) -> int | None:
        """For a curve that pays in no measured bucket: where its threshold turns speculation
        off, when that is above 1 (speculation still runs below it, unmeasured), else None."""
        if self.crossover.status != "never_pays":
            return None
        off = self.off_from
        return off if off > 1 else None

    def agrees_with(self, threshold: int | None) -> bool:
        """Whether a one-sided measurement leaves `threshold` standing: a curve that pays in
        every measured bucket puts the crossover past them, so any threshold from its bound up
        agrees (None: above every batch); one that pays in none puts it below them, so any
        threshold up to where it turns speculation off agrees. A load that fell (or rose) away
        from the crossover measured earlier then does not move it."""
        if self.crossover.status == "always_pays":
            bound = self.bound
            return threshold is None or (bound is not None and threshold >= bound)
        if self.crossover.status == "never_pays":
            return threshold is not None and threshold <= self.off_from
        return False

    def flips_a_clear_bucket(self, a: int | None, b: int | None) -> bool:
        """Whether moving the threshold from a to b changes the mode in a measured bucket whose
        speedup clearly asks for that change (batches from the lower threshold up to the higher
        change mode; None is above every batch): speculation on where it clearly pays, off where
        it clearly loses. The dead band holds one-bucket moves because the crossover is only
        located within a bucket, not moves that measurement clearly asks for: threshold 1 runs
        batch 1 plain, where speculation may pay by half; 39 -> 63 speculates at batch 54, where
        it paid 7% over hundreds of steps in each mode. A move the other way through such a
        bucket is the crossover's noise: 62 -> 65 speculating at 64, where it clearly lost, moved
        a steady load's threshold at every recheck (spectune-sim)."""
        low, high = sorted(math.inf if t is None else t for t in (a, b))
        raising = high == (math.inf if b is None else b)
        return any(low <= p.batch < high and self.clearly(p, pays=raising) for p in self.curve)

    def compact_curve(self) -> dict[str, float]:
        """Bucket -> speedup, rounded, for status (string keys: JSON objects)."""
        return {str(p.batch): round(p.speedup, 3) for p in self.curve}


def clearly_not_one(point: SpeedupPoint, noise: float | None = None) -> bool:
    """Whether a bucket's speedup is beyond its noise from 1: CLEAR_Z standard errors of the
    ratio (its relative `noise`, else STEP_NOISE per step in each mode), and CLEAR_FLOOR."""
    se = point.speedup * (assumed_noise(point) if noise is None else noise)
    return abs(point.speedup - 1) >= max(CLEAR_FLOOR, CLEAR_Z * se)


def assumed_noise(point: SpeedupPoint) -> float:
    """The speedup's relative standard error at STEP_NOISE per step in each mode."""
    return STEP_NOISE * math.sqrt(1 / point.plain.steps + 1 / point.spec.steps)


def speedup_noise(
    curve: tuple[SpeedupPoint, ...], throughput: Mapping[tuple[str, int], float]
) -> dict[int, float]:
    """Bucket -> the speedup's relative standard error: from both modes' measured throughput
    errors where the window's batches gave them (a ratio's relative errors add in quadrature),
    else assumed (`assumed_noise`)."""
    out = {}
    for p in curve:
        spec, plain = throughput.get(("spec", p.batch)), throughput.get(("plain", p.batch))
        measured = spec is not None and plain is not None
        out[p.batch] = math.hypot(spec, plain) if measured else assumed_noise(p)
    return out


def common_buckets(
    stats: Mapping[tuple[str, int], ModeStats], rare_share: float = RARE_SHARE
) -> list[int]:
    """Buckets holding decode steps, and at least `rare_share` of them (both modes counted)."""
    steps: dict[int, float] = {}
    for (_, bucket), s in stats.items():
        steps[bucket] = steps.get(bucket, 0.0) + s.steps
    total = sum(steps.values())
    return [b for b in sorted(steps) if steps[b] > 0 and steps[b] >= rare_share * total]


def undersampled(
    stats: Mapping[tuple[str, int], ModeStats],
    min_steps: int = MIN_STEPS,
    rare_share: float = RARE_SHARE,
) -> list[int]:
    """Buckets that traffic reaches (`common_buckets`) but that lack `min_steps` in one of the
    modes: what a calibration still waits for."""
    return [
        b
        for b in common_buckets(stats, rare_share)
        if min(stats.get((m, b), ModeStats()).steps for m in ("spec", "plain")) < min_steps
    ]


def estimate(
    sku: str,
    stats: Mapping[tuple[str, int], ModeStats],
    min_steps: int = MIN_STEPS,
    throughput_noise: Mapping[tuple[str, int], float] | None = None,
    gain: float = 0.0,
) -> Estimate:
    """The crossover of one SKU from its (mode, bucket) sums over a window, where speculation
    stops paying by `gain` or more (a share: speedup 1 + gain), and the relative standard error
    of each (mode, bucket)'s throughput where the window measured it."""
    curve = tuple(speedup_curve(stats, min_steps))
    crossover = crossover_of(curve, gain)
    seen = [bucket for (_, bucket), s in stats.items() if s.steps > 0]
    largest = max(seen) if seen else None
    noise = speedup_noise(curve, throughput_noise or {})
    off = _off_from(curve, noise) if crossover.status == "never_pays" else None
    return Estimate(
        sku=sku,
        crossover=crossover,
        curve=curve,
        largest_batch_seen=largest,
        reason=_reason(crossover, curve, largest, min_steps, off, gain),
        noise=noise,
    )


def _off_from(curve: tuple[SpeedupPoint, ...], noise: Mapping[int, float]) -> int:
    """Where a curve that pays in no measured bucket turns speculation off: its first bucket, or
    a lower bucket edge down to which its loss holds (`_loses_from`). (A saturated fleet's first
    calibration measured batch 128 alone, speedup about 0.7, and asked for 128; once its load
    eased, its pods speculated at 96-127: 0.86x a fixed threshold for two windows,
    examples/sim/saturated-start.yaml.)"""
    return _loses_from(curve[0], noise)


def _loses_from(point: SpeedupPoint, noise: Mapping[int, float]) -> int:
    """The lowest batch at which a bucket's loss shows speculation losing: its bucket, or a
    lower bucket edge. A step's time grows at most in proportion to its batch (a fixed cost plus
    one per sequence), so at batch b below m speedup is at most m/b times its value at m: with
    the bucket's speedup s (at its upper error) at mean batch m, speculation pays at no batch
    from m x s up."""
    loses_from = _loss_bound(point, noise)
    return next((b for b in BATCH_BUCKETS if loses_from <= b < point.batch), point.batch)


def _loss_bound(point: SpeedupPoint, noise: Mapping[int, float]) -> float:
    """The batch from which a bucket's loss, at its upper error, bounds speedup below 1."""
    se = point.speedup * noise.get(point.batch, assumed_noise(point))
    return point.mean_batch * (point.speedup + CLEAR_Z * se)


def estimate_by_sku(
    stats: Mapping[str, Mapping[tuple[str, int], ModeStats]],
    noise: Mapping[str, Mapping[tuple[str, int], float]] | None = None,
    min_steps: int = MIN_STEPS,
    gain: float = 0.0,
) -> dict[str, Estimate]:
    """One estimate per SKU: pods on different GPUs each get their own crossover."""
    return {
        sku: estimate(sku, s, min_steps, (noise or {}).get(sku), gain)
        for sku, s in sorted(stats.items())
    }


def _deciding(crossover: Crossover, curve: tuple[SpeedupPoint, ...]) -> list[SpeedupPoint]:
    """The buckets the answer rests on: the two around a crossing, else the edge bucket."""
    if crossover.status == "crosses":
        assert crossover.batch is not None
        below = [p for p in curve if p.mean_batch < crossover.batch]
        above = [p for p in curve if p.mean_batch >= crossover.batch]
        return below[-1:] + above[:1]
    if crossover.status == "always_pays":
        return list(curve[-1:])
    return list(curve[:1])


def _bound(crossover: Crossover, curve: tuple[SpeedupPoint, ...]) -> int | None:
    if crossover.status != "always_pays":
        return None
    return next((b for b in BATCH_BUCKETS if b > curve[-1].batch), None)


def _reason(
    crossover: Crossover,
    curve: tuple[SpeedupPoint, ...],
    largest: int | None,
    min_steps: int,
    off: int | None,
    gain: float,
) -> str:
    by = f" by {gain:.0%} or more" if gain else ""
    if crossover.status == "unknown":
        if largest is None:
            return "no decode steps in the window"
        return f"no batch bucket has {min_steps} steps in both modes yet"
    if crossover.status == "always_pays":
        bound = f"above {curve[-1].batch}, the largest batch measured in both modes"
        if largest is not None and largest > curve[-1].batch:
            bound += f" (traffic reached {largest}, not yet sampled in both modes)"
        stop = _bound(crossover, curve)
        if stop is not None:
            bound += f"; asks for threshold {stop}, where the measured batches end"
        return f"speculation pays at every batch measured{by}: crossover {bound}"
    if crossover.status == "never_pays":
        first = curve[0].batch
        said = f"speculation does not pay{by} even at batch {first}, the smallest measured"
        if off is None or off == first:
            return (
                said if first == 1 else f"{said}; off from {first} up, smaller batches not measured"
            )
        bound = (
            f"the loss at {first} bounds speedup below 1 there (step time grows at most in "
            "proportion to the batch)"
        )
        if off == 1:
            return f"{said}; off at every batch: {bound}"
        return f"{said}; off from {off} up: {bound}, smaller batches not measured"
    (low, high) = _deciding(crossover, curve)
    at = f", where speedup falls to {1 + gain:.2f}" if gain else ""
    return (
        f"crossover at batch {crossover.batch:.1f}{at}: speedup {low.speedup:.2f} at batch "
        f"{low.mean_batch:.0f}, {high.speedup:.2f} at {high.mean_batch:.0f}"
    )
