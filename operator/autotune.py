"""Calibration as a pure state machine (DESIGN.md, "Re-measuring the crossover on live traffic").

Idle -> Exploring (a trigger fired: the engines run the other mode more often) -> Verifying (Auto
moved a threshold: goodput is compared before vs after) -> Idle. Each turn calls `step`
with what it observed; the state lives in the SpecDeployment's status, so a restarted operator
resumes where the last one stopped. What the engines should run (`engine_settings`) is derived
from that state alone, so a restart never leaves an engine exploring. `now` is a parameter and
nothing here does I/O: every decision is reproducible in a test.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from spectune.engine.contract import BATCH_BUCKETS
from spectune.engine.crossover import ModeStats, StatsByBucket
from spectune.operator.damping import clamp, damp
from spectune.operator.estimator import (
    Estimate,
    common_buckets,
    estimate_by_sku,
    undersampled,
)
from spectune.operator.models import (
    Baseline,
    BucketSums,
    CalibrationStatus,
    CrossoverStatus,
    Outcome,
    SkuThreshold,
    SpecDeploymentSpec,
    SpeculationKey,
    ThresholdStatus,
)
from spectune.operator.observations import FleetWindow, ServedByBucket, Traffic, served
from spectune.operator.triggers import (
    Reason,
    SpecKey,
    below_floor,
    past_bound,
    replicas_changed,
    skus_unmeasured,
    spec_changed,
    too_old,
    traffic_shifted,
)
from spectune.operator.verification import (
    GoodputCheck,
    compare_goodput,
    queueing_warning,
    same_mix_speedup,
)

# Exploration while calibrating: the mode the threshold hides gets half the iterations. Equal
# shares compare two modes' means with the least variance for a given number of steps, and a
# bucket reaches its samples in both modes within one window even where the engine steps slowly
# (a quarter left the high buckets of a 2-core machine under MIN_STEPS in a 45 s window).
CALIBRATION_EXPLORATION_PERCENT = 50
# The shortest window worth reading: two scrape intervals at least (`min_window`), or
# increase() has too few points.
MIN_WINDOW_SECONDS = 10
# A calibration window must hold this many scrapes: fewer leave each bucket's two modes a
# handful of points (a 60 s window at the 30 s interval most clusters scrape at holds two).
MIN_SCRAPES_PER_WINDOW = 8
# The calibration window when the spec leaves it unset and the scrape interval is 15 s or less
# (or not seen yet); at longer intervals, MIN_SCRAPES_PER_WINDOW of them.
DEFAULT_WINDOW_SECONDS = 120
# The share by which an observed scrape interval may exceed the configured one: Prometheus
# scrapes late under load (a 30 s interval read as the median gap 30.011 s on a busy machine).
SCRAPE_JITTER = 0.01
# A curve that does not cross is kept once the batch range traffic reaches has stopped growing
# for this share of the calibration window (30 s of the default 120): the load has shown its
# range, and traffic that later runs past it is the past-bound trigger's to re-measure.
RANGE_SETTLED_SHARE = 0.25
# A calibration whose crossover rests on buckets too noisy to tell a 15% step in speedup (an
# estimate's confidence below this: three standard errors of 5%) explores on past its window,
# up to this many windows in all, rather than move a threshold on noise; then it decides on
# what it has. Neighbouring buckets near a crossover differ by 5-15% in speedup: noise beyond
# that hides more than the bucket the dead band already allows.
MIN_CONFIDENCE = 1 / 3
EXTENDED_WINDOWS = 2
# No calibration starts until the last pod to become ready has served for this share of the
# calibration window: the "before" window its change is verified against must hold a load the
# engines were serving, not their first seconds (a fleet still filling its batches read as a
# third of its load, and a good change was rolled back as "not comparable"; spectune-sim).
READY_SHARE = 0.5
# A traffic shift past trafficChangePercent moves the crossover by far less than this factor, so
# the calibration it starts explores speculation past the threshold at most up to this many
# times the highest threshold in force (to a bucket's edge): an explored spec iteration far past
# the threshold costs the most and answers nothing the shift could have changed (a busy A100
# fleet at batch 64 and up, threshold 8, lost 23% of a window to one; spectune-sim). It starts
# one bucket past the threshold and widens a bucket at a time while the top bucket explored
# clearly pays: on a busy L4 fleet, 20 s of speculation explored at 50% over batches 6-23 cost a
# window 5.6% of its goodput in TPOT misses (spectune-sim). A crossover that moved further
# reads as speculation paying up to the range's end, and past_bound re-measures at every batch
# once traffic runs there.
EXPLORE_RANGE = 4
# A change whose goodput check cannot decide (Prometheus down, load not comparable) is verified
# for up to this many calibration windows after it, then rolled back: kept only on a verdict.
VERIFY_WINDOWS = 3


# Why a turn has no window to decide on: the Degraded condition's reason, and what it says.
# Every one of them is handled alike (exploration aborted, verification extended up to its
# deadline): no failure of a read or a decision may stall the state machine.
BlindReason = Literal["PrometheusUnavailable", "MetricsReadFailed", "DecisionFailed"]
BLIND_REASONS: Mapping[BlindReason, str] = {
    "PrometheusUnavailable": "Prometheus unavailable",
    "MetricsReadFailed": "reading the engines' metrics failed",
    "DecisionFailed": "deciding on the engines' metrics failed",
}


@dataclass(frozen=True)
class Observation:
    """What the operator saw this time round."""

    now: datetime
    replicas: int  # ready engine pods
    settled: bool  # every desired pod ready and up to date: no calibration mid-rollout
    window: FleetWindow | None  # over `window_seconds(...)`; None: no window (`error` says why)
    recent: Sequence[tuple[datetime, Traffic]] = ()  # (read at, window), oldest first
    error: str | None = None  # why `window` is None
    error_reason: BlindReason = "PrometheusUnavailable"  # what kind of failure `error` is
    selector: str = ""  # the label matchers the engines were read with
    unscraped: tuple[str, ...] = ()  # ready pods without fresh engine series in `window`
    ready_at: datetime | None = None  # when the last of the ready pods became ready
    scrape_problems: Mapping[str, str] = dataclasses.field(default_factory=dict)  # pod -> why

    @property
    def blind(self) -> str:
        """Why this turn has no window, for Events and conditions."""
        return f"{BLIND_REASONS[self.error_reason]} ({self.error})"

    def scrape_interval_or(self, last: float | None) -> float | None:
        """The scrape interval this read saw, else `last` (the one seen before): a failed read,
        or one of series with a single sample each, sees none."""
        return (self.window.scrape_interval if self.window else None) or last


@dataclass(frozen=True)
class Event:
    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True)
class State:
    """The part of status the autotuner owns."""

    threshold: ThresholdStatus
    crossover: CrossoverStatus
    per_sku: tuple[SkuThreshold, ...]
    calibration: CalibrationStatus


@dataclass(frozen=True)
class Step:
    state: State
    events: tuple[Event, ...] = ()


def _iso(t: datetime) -> str:
    return t.isoformat()


def _time(s: str) -> datetime:
    return datetime.fromisoformat(s)


def _traffic_dict(t: Traffic) -> dict[str, float]:
    return {k: v for k, v in dataclasses.asdict(t).items() if v is not None}


def _traffic(d: Mapping[str, float]) -> Traffic | None:
    return Traffic(**d) if "seconds" in d else None


def _sums_dict(steps: Mapping[str, StatsByBucket]) -> dict[str, dict[str, BucketSums]]:
    return {
        sku: {
            str(b): BucketSums(steps=s.steps, tokens=s.tokens, seconds=s.seconds)
            for b, s in buckets.items()
        }
        for sku, buckets in served(steps).items()
    }


def _old_mode_sums(
    steps: Mapping[str, StatsByBucket], thresholds: Mapping[str, int | None]
) -> dict[str, dict[str, BucketSums]]:
    """Per SKU and bucket, the calibration window's steps in the mode the `thresholds` before
    the change ran there (None: speculation everywhere): each bucket's rate under them at the
    load the change meets. The window before the calibration may not have reached these
    batches at all (a load that rose past a bound is what started it)."""
    out: dict[str, dict[str, BucketSums]] = {}
    for sku, stats in steps.items():
        t = thresholds.get(sku)
        for (mode, bucket), s in stats.items():
            if mode == ("spec" if t is None or bucket < t else "plain"):
                out.setdefault(sku, {})[str(bucket)] = BucketSums(
                    steps=s.steps, tokens=s.tokens, seconds=s.seconds
                )
    return out


def _sums(d: Mapping[str, Mapping[str, BucketSums]]) -> dict[str, dict[int, ModeStats]]:
    return {
        sku: {int(b): ModeStats(s.steps, s.tokens, s.seconds) for b, s in buckets.items()}
        for sku, buckets in d.items()
    }


def min_window(interval: float | None) -> float:
    """The shortest window worth reading at this scrape interval (None: not seen yet)."""
    return max(MIN_WINDOW_SECONDS, 2 * interval) if interval else MIN_WINDOW_SECONDS


def with_window(spec: SpecDeploymentSpec, interval: float | None) -> SpecDeploymentSpec:
    """The spec with its calibration window filled in where the user left it unset: enough
    scrapes at the `interval` observed (the last one seen, None: not yet), so that a cluster
    scraping every 30 s needs no hand-set 240."""
    if spec.tuning.calibrationWindowSeconds is not None:
        return spec
    # whole seconds: Prometheus scrapes a few ms late (30.011 s), and the window must not move
    window = max(DEFAULT_WINDOW_SECONDS, MIN_SCRAPES_PER_WINDOW * round(interval or 0))
    tuning = spec.tuning.model_copy(update={"calibrationWindowSeconds": window})
    return spec.model_copy(update={"tuning": tuning})


def window_too_short(spec: SpecDeploymentSpec, interval: float | None) -> str | None:
    """Why the spec's calibration window is refused at this scrape interval, or None. Scrapes
    run a few milliseconds late under load, so the interval is judged less SCRAPE_JITTER and
    said to three figures: the window the message asks for is never refused for them. A
    window left unset follows the interval (`with_window`): never too short."""
    window = spec.tuning.calibrationWindowSeconds
    if window is None or not interval:
        return None
    if window >= MIN_SCRAPES_PER_WINDOW * interval * (1 - SCRAPE_JITTER):
        return None
    return (
        f"tuning.calibrationWindowSeconds {window} holds {window / interval:.1f} scrapes at the "
        f"{interval:.3g} s scrape interval observed; a calibration needs {MIN_SCRAPES_PER_WINDOW} "
        f"({round(MIN_SCRAPES_PER_WINDOW * interval)} s or more)"
    )


def window_seconds(
    spec: SpecDeploymentSpec,
    cal: CalibrationStatus,
    now: datetime,
    ready_at: datetime | None = None,
    interval: float | None = None,
) -> int:
    """The window to read: since the calibration started while exploring, since the change
    while verifying (only what each phase caused counts), else one calibration window, cut
    at the end of the last calibration: a "before" window holding its raised exploration or
    the threshold before its change would compare the next change with another fleet. It is
    cut, too, where the last ready pod became ready (`ready_at`): a window reaching back
    before the engines served divides their requests by seconds nobody served in, and a
    change verified against that rate meets a load that looks three times higher."""
    since = {"Exploring": cal.startedAt, "Verifying": cal.changedAt}.get(cal.phase)
    if since is None:
        calm = _calm_seconds(cal, now, ready_at)
        window = spec.tuning.calibrationWindowSeconds
        shortest = min_window(interval)
        return window if calm is None else int(max(shortest, min(window, calm)))
    return int(max(min_window(interval), (now - _time(since)).total_seconds()))


def _calm_seconds(
    cal: CalibrationStatus, now: datetime, ready_at: datetime | None = None
) -> float | None:
    """Seconds since the engines last ran other settings (a calibration's end or a threshold
    change) or the fleet last changed (a pod became ready); None when neither happened."""
    ends = [_time(t) for t in (cal.finishedAt, cal.changedAt) if t is not None]
    ends += [ready_at] if ready_at is not None else []
    return (now - max(ends)).total_seconds() if ends else None


def thresholds_by_sku(state: State) -> dict[str, int | None]:
    """SKU -> the threshold its engines run: measured ones only (a start value, a pinned one
    and a rolled-back-to spec value are the deployment's, for every SKU)."""
    if state.threshold.source != "Measured":
        return {}
    return {s.sku: s.threshold for s in state.per_sku}


def engine_settings(
    spec: SpecDeploymentSpec, state: State, sku: str | None
) -> tuple[int | None, int]:
    """(threshold, exploration percent) an engine on `sku` should run: its SKU's measured
    threshold when there is one, else the deployment's (what the ConfigMap carries: `sku`
    None); raised exploration only while exploring."""
    percent = (
        CALIBRATION_EXPLORATION_PERCENT
        if state.calibration.phase == "Exploring"
        else spec.tuning.explorationPercent
    )
    threshold = thresholds_by_sku(state).get(sku, state.threshold.current)
    return threshold, percent


def explore_below(state: State, reason: Reason, skus: Collection[str]) -> int | None:
    """The batch below which a calibration started for `reason` explores speculation past the
    threshold: the reason's own end (`reason.below`), or for a shift that moves the crossover
    by a bounded factor (`reason.near`) the bucket edge one past the highest threshold the
    `skus` run (`widened_below` widens it while speculation pays or to reach the traffic);
    None (every batch) for other reasons, or where a SKU speculates at every batch."""
    if reason.below is not None:
        return reason.below
    highest = _highest_threshold(state, skus)
    if not reason.near or highest is None:
        return None
    return _next_edge(max(1, highest))


def explore_cap(state: State, skus: Collection[str]) -> int | None:
    """How far a calibration may widen its explored range: EXPLORE_RANGE times the highest
    threshold the `skus` run, up to a bucket's edge (None: every batch)."""
    highest = _highest_threshold(state, skus)
    if highest is None:
        return None
    top = EXPLORE_RANGE * max(1, highest)
    return next((b for b in BATCH_BUCKETS if b >= top), None)


def _highest_threshold(state: State, skus: Collection[str]) -> int | None:
    """The highest threshold the `skus` run; None where one speculates at every batch."""
    by_sku = thresholds_by_sku(state)
    runs = [by_sku.get(sku, state.threshold.current) for sku in skus] or [state.threshold.current]
    if None in runs:
        return None
    return max(t for t in runs if t is not None)


def _next_edge(batch: int) -> int | None:
    """The first bucket edge above `batch` (None past the last)."""
    return next((b for b in BATCH_BUCKETS if b > batch), None)


def trigger(spec: SpecDeploymentSpec, state: State, obs: Observation) -> Reason | None:
    """The first change since the last measurement, in order of how much it moves the curve.
    Only a calibration that ended without a kept measurement, or with a move the dwell held
    back, waits (`retryAfter`): a fleet change right after a good one is looked at in the next
    turn. A new configuration (a spec change, a GPU SKU not measured yet) does not wait for the
    dwell, which damps moves, not measurements of something new; calibrations that keep
    failing (`failures`) hold every trigger, or the one that failed would start again at once."""
    cal = state.calibration
    held = cal.retryAfter is not None and obs.now < _time(cal.retryAfter)
    if held and cal.failures:
        return None
    base = cal.baseline
    if base is None:
        return None if held else Reason("Initial", "no crossover measured yet")
    assert obs.window is not None
    measured = _time(base.measuredAt)
    max_age = timedelta(seconds=spec.tuning.maxAgeSeconds)
    aged = too_old(measured, obs.now, max_age)
    new = spec_changed(
        SpecKey(base.model, base.draft, base.method, base.k), SpecKey.of(spec)
    ) or skus_unmeasured(measured_skus(state), obs.window.skus, obs.now, None if aged else max_age)
    if new is not None or held:
        return new
    baseline_traffic = _traffic(base.traffic)
    # only windows wholly after the measurement: older ones saw the fleet it replaced, or the
    # calibration itself (whose batches the measurement already covers)
    recent = [t for at, t in obs.recent if at - timedelta(seconds=t.seconds) >= measured]
    after = obs.now - measured >= timedelta(seconds=spec.tuning.calibrationWindowSeconds)
    steps = obs.window.steps if after else {}
    return (
        replicas_changed(base.replicas, obs.replicas, base.covered, steps)
        or (
            traffic_shifted(
                baseline_traffic, recent, spec.tuning.trafficChangePercent, outcomes=base.outcomes
            )
            if baseline_traffic is not None
            else None
        )
        or past_bound(base.bounds, steps)
        or below_floor(base.floors, steps)
        or aged
    )


def measured_skus(state: State) -> dict[str, datetime]:
    """GPU SKU -> when its crossover was last measured: the last calibration's SKUs then, and
    each SKU in status by its own time where that is later (a SKU the last calibration did not
    see keeps its threshold and its age)."""
    base = state.calibration.baseline
    out = {sku: _time(base.measuredAt) for sku in base.skus} if base is not None else {}
    for p in state.per_sku:
        if p.measuredAt is not None and (p.sku not in out or _time(p.measuredAt) > out[p.sku]):
            out[p.sku] = _time(p.measuredAt)
    return out


def step(spec: SpecDeploymentSpec, state: State, obs: Observation) -> Step:
    """One turn of the state machine. Manual pins every engine and forgets what was measured
    (switching back to Auto re-measures); Advisory measures and recommends but never moves a
    threshold."""
    cal = state.calibration
    if spec.speculation.threshold.mode == "Manual":
        return _manual(spec, state, obs.now)
    if cal.phase != "Idle" and (moved := _config_moved(spec, cal)) is not None:
        return _interrupted(spec, state, obs.now, moved)
    if obs.window is None:
        if cal.phase == "Exploring":
            why = f"{obs.blind}: threshold kept, exploration lowered"
            aborted = Event("CalibrationAborted", why, warning=True)
            return _give_up(spec, state, obs.now, aborted, failed=why)
        if cal.phase == "Verifying":
            return _unverified(spec, state, obs.now, obs.blind)
        return Step(state)
    if cal.phase == "Exploring":
        return _explore(spec, state, obs, obs.window)
    if cal.phase == "Verifying":
        return _verify(spec, state, obs, obs.window)
    state = without_departed(spec, state, obs.window, obs.now)
    if not obs.settled:
        return Step(state)
    interval = obs.window.scrape_interval
    calm = _calm_seconds(cal, obs.now)
    if calm is not None and calm < min_window(interval):
        return Step(state)  # the "before" window would hold the last calibration
    serving = READY_SHARE * spec.tuning.calibrationWindowSeconds
    if obs.ready_at is not None and (obs.now - obs.ready_at).total_seconds() < serving:
        return Step(state)  # ... or the engines' first seconds
    if obs.unscraped or window_too_short(spec, interval):
        return Step(state)  # metrics first: exploring what cannot be measured only costs
    if interval is None:
        # ... nor what cannot be judged yet: an engine counts once scraped (its first sample
        # old enough), and until a second scrape the interval, and so whether the window
        # holds enough scrapes, is unknown (at 30 s scrapes a calibration started with one
        # scrape seen, then was found too short for its window)
        return Step(state)
    reason = trigger(spec, state, obs)
    if reason is None:
        return Step(state)
    key = SpecKey.of(spec)
    started = cal.model_copy(
        update={
            "phase": "Exploring",
            "trigger": reason.kind,
            "message": reason.message,
            "startedAt": _iso(obs.now),
            "config": SpeculationKey(model=key.model, draft=key.draft, method=key.method, k=key.k),
            "before": _traffic_dict(obs.window.traffic),
            "beforeSteps": _sums_dict(obs.window.steps),
            "reached": {},
            "reachedAt": None,
            "extendedAt": None,
            "exploreBelow": explore_below(state, reason, obs.window.skus),
            "losesFrom": reason.below,  # a floor: where speculation was measured to lose
        }
    )
    return Step(
        dataclasses.replace(state, calibration=started),
        (Event("CalibrationStarted", f"re-measuring the crossover: {reason.message}"),),
    )


def without_departed(
    spec: SpecDeploymentSpec, state: State, window: FleetWindow, now: datetime
) -> State:
    """Each SKU's threshold with when its last pod left (`goneSince`, cleared when one is back),
    and without the SKUs gone for longer than the maximum age: status (and the engines'
    per-SKU map) kept every SKU the deployment ever ran on. Until then a SKU keeps its
    threshold, for pods that come back."""
    if not window.skus:  # unknown: no pod scraped yet
        return state
    age = timedelta(seconds=spec.tuning.maxAgeSeconds)
    kept = []
    for p in state.per_sku:
        gone = None if p.sku in window.skus else (p.goneSince or _iso(now))
        if gone is None or now - _time(gone) < age:
            kept.append(p if gone == p.goneSince else p.model_copy(update={"goneSince": gone}))
    return (
        state if tuple(kept) == state.per_sku else dataclasses.replace(state, per_sku=tuple(kept))
    )


def _manual(spec: SpecDeploymentSpec, state: State, now: datetime) -> Step:
    """The pinned value on every engine: per-SKU thresholds and the baseline are dropped, so
    nothing measured outlives the pin and Auto starts from a fresh measurement."""
    cal = state.calibration
    pinned = dataclasses.replace(
        state, per_sku=(), calibration=cal.model_copy(update={"baseline": None})
    )
    if cal.phase == "Idle":
        return Step(pinned)
    cancelled = Event("CalibrationCancelled", "threshold mode is Manual")
    return _give_up(spec, pinned, now, cancelled)


def _config_moved(spec: SpecDeploymentSpec, cal: CalibrationStatus) -> Reason | None:
    """The spec change since the calibration started that moves the curve it measures."""
    if cal.config is None:
        return None
    c = cal.config
    return spec_changed(SpecKey(c.model, c.draft, c.method, c.k), SpecKey.of(spec))


def _interrupted(spec: SpecDeploymentSpec, state: State, now: datetime, moved: Reason) -> Step:
    """A calibration whose configuration changed under it: what it measured belongs to the
    old one. Exploring ends at once (the next turn re-measures the new one); Verifying
    rolls back, since its goodput check would compare two configurations."""
    if state.calibration.phase == "Exploring":
        why = f"{moved.message}: re-measuring the new configuration"
        return _finish(state, now, Event("CalibrationRestarted", why))
    return _roll_back(spec, state, now, f"{moved.message} before the change was verified")


def _finish(state: State, now: datetime, *events: Event, retry_after: str | None = None) -> Step:
    update = {
        "phase": "Idle",
        "finishedAt": _iso(now),
        "retryAfter": retry_after,
        "unverified": None,
    }
    cal = state.calibration.model_copy(update=update)
    return Step(dataclasses.replace(state, calibration=cal), events)


def _give_up(
    spec: SpecDeploymentSpec,
    state: State,
    now: datetime,
    *events: Event,
    failed: str | None = None,
) -> Step:
    """End a calibration that kept nothing it measured (failed, aborted, cancelled, rolled
    back): the next trigger waits one window, so that it is retried once a window, not in
    every turn. One that `failed` to measure anything (why: too little traffic, Prometheus
    gone) waits twice as long as the failure before it, up to the maximum age, and status says
    why: traffic too thin to measure explored half the time, failing every minute, forever."""
    cal = state.calibration
    update: dict[str, object] = {}
    windows = 1
    if failed is not None:
        update = {"failures": cal.failures + 1, "message": failed}
        windows = 2**cal.failures
    wait = min(windows * spec.tuning.calibrationWindowSeconds, spec.tuning.maxAgeSeconds)
    counted = dataclasses.replace(state, calibration=cal.model_copy(update=update))
    return _finish(counted, now, *events, retry_after=_iso(now + timedelta(seconds=wait)))


def reached(window: FleetWindow, before: Mapping[str, list[int]]) -> dict[str, list[int]]:
    """SKU -> [smallest, largest] batch bucket traffic reaches (`common_buckets`), widened by
    the range `before`: within a calibration the range only grows, and a rare bucket, which
    holds nothing up, does not count as growth."""
    out = {sku: list(r) for sku, r in before.items()}
    for sku, stats in window.steps.items():
        if seen := common_buckets(stats):
            low, high = out.get(sku, (seen[0], seen[-1]))
            out[sku] = [min(low, seen[0]), max(high, seen[-1])]
    return out


def decided(
    window: FleetWindow,
    estimates: Mapping[str, Estimate],
    settled: bool,
    below: int | None,
) -> bool:
    """Every bucket traffic reaches below the explored range's end (`below`) has its samples
    in both modes, on every SKU, and each SKU's curve crosses, or the range of batches reached
    has `settled`: a bound ("pays up to 40") read before that may only mean the load has not
    yet come round to larger batches."""
    return (
        bool(window.steps)
        and not any(
            below is None or b < below for s in window.steps.values() for b in undersampled(s)
        )
        and (settled or all(e.crossover.status == "crosses" for e in estimates.values()))
    )


def _explore(spec: SpecDeploymentSpec, state: State, obs: Observation, window: FleetWindow) -> Step:
    cal = state.calibration
    assert cal.startedAt is not None
    elapsed = (obs.now - _time(cal.startedAt)).total_seconds()
    if (reach := reached(window, cal.reached)) != cal.reached:
        cal = cal.model_copy(update={"reached": reach, "reachedAt": _iso(obs.now)})
        state = dataclasses.replace(state, calibration=cal)
    window_s = spec.tuning.calibrationWindowSeconds
    steady = (obs.now - _time(cal.reachedAt)).total_seconds() if cal.reachedAt else 0.0
    shortest = min_window(window.scrape_interval)
    settled = steady >= max(shortest, RANGE_SETTLED_SHARE * window_s)
    estimates = estimate_by_sku(
        window.steps, window.noise, gain=spec.tuning.requiredGainPercent / 100
    )
    narrowed: tuple[Event, ...] = ()
    if (below := narrowed_below(estimates, window.skus, cal.exploreBelow)) != cal.exploreBelow:
        cal = cal.model_copy(update={"exploreBelow": below, "losesFrom": below})
        state = dataclasses.replace(state, calibration=cal)
        narrowed = (Event("ExplorationNarrowed", _narrowing(estimates, below)),)
    elif (
        wider := widened_below(
            estimates,
            window.skus,
            below,
            explore_cap(state, window.skus),
            lowest := past_range(window, below),
            cal.losesFrom,
        )
    ) != below:
        cal = cal.model_copy(update={"exploreBelow": wider})
        state = dataclasses.replace(state, calibration=cal)
        narrowed = (Event("ExplorationWidened", _widening(lowest, below, wider)),)
    done = decided(window, estimates, settled, cal.exploreBelow)
    if elapsed < shortest or (not done and elapsed < window_s):
        return Step(state, narrowed)  # narrowed on any read: a clear loss is clear
    estimates = {k: e for k, e in estimates.items() if e.known}
    noisy = too_noisy(estimates)
    if noisy and elapsed < EXTENDED_WINDOWS * window_s:
        if elapsed < window_s or cal.extendedAt is not None:
            return Step(state, narrowed)
        cal = cal.model_copy(update={"extendedAt": _iso(obs.now)})
        why = f"{noisy}: exploring on, for up to {EXTENDED_WINDOWS * window_s} s in all"
        extended = dataclasses.replace(state, calibration=cal)
        return Step(extended, (*narrowed, Event("CalibrationExtended", why)))
    if not estimates:
        if (past := past_range(window, cal.exploreBelow)) is not None:
            return _kept_past_range(spec, state, obs, window, past)
        why = "no SKU has a batch bucket measured in both modes: threshold kept, retrying"
        failed = Event("CalibrationFailed", why, warning=True)
        return _give_up(spec, state, obs.now, failed, failed=why)
    return _decide(spec, state, obs, window, estimates)


def narrowed_below(
    estimates: Mapping[str, Estimate], skus: Collection[str], below: int | None
) -> int | None:
    """The explored range's end once every SKU's speculation clearly loses from some batch
    (`Estimate.loses_from`): the highest of those batches, where that is below `below` (None:
    every batch); else `below`. Exploring speculation past it measures nothing the estimate
    still needs, at the highest price an explored iteration has: 50% of a busy fleet's
    iterations speculating at batch 88, far past its crossover, for the 40 s of its first
    calibration cost 0.2% of its goodput over half an hour (spectune-sim)."""
    froms = [estimates[sku].loses_from if sku in estimates else None for sku in skus]
    if not froms or None in froms:
        return below
    top = max(b for b in froms if b is not None)
    return top if below is None or top < below else below


def widened_below(
    estimates: Mapping[str, Estimate],
    skus: Collection[str],
    below: int | None,
    cap: int | None,
    lowest: int | None = None,
    loses_from: int | None = None,
) -> int | None:
    """The explored range's end moved past the buckets, from its top one (the bucket ending at
    `below`) up, where speculation clearly pays on some SKU, up to `cap`, to the first bucket
    where it clearly loses on any, and never past where `narrowed_below` would end it: while
    it pays at the range's end, the crossover may lie past it. Where traffic runs only past the
    range (from bucket `lowest` up, `past_range`), past that bucket, up to where speculation was
    measured to lose (`loses_from`: where this calibration narrowed, or the floor it measures
    below) and to `cap`: the range reaches the traffic. Else `below`."""
    losing = narrowed_below(estimates, skus, None)
    cap = min((c for c in (cap, losing) if c is not None), default=None)
    if below is None or below <= 1 or (cap is not None and below >= cap):
        return below
    top = max(b for b in BATCH_BUCKETS if b < below)

    def clearly(pays: bool, batch: int) -> bool:
        return any(
            e.clearly(p, pays) for e in estimates.values() for p in e.curve if p.batch == batch
        )

    end = below
    if lowest is not None and losing is None and (past := _next_edge(lowest)) is not None:
        end = max(below, past if loses_from is None else min(past, loses_from))
    while clearly(True, top) and not clearly(False, end) and (wider := _next_edge(end)):
        top, end = end, wider
    return end if cap is None else min(end, cap)


def _widening(lowest: int | None, below: int | None, wider: int | None) -> str:
    if lowest is not None:
        why = f"traffic ran at batch {lowest} and up, past the batches explored (below {below})"
    else:
        why = f"speculation clearly pays below {below}"
    return f"{why}: exploring speculation below {wider} from now"


def _narrowing(estimates: Mapping[str, Estimate], below: int | None) -> str:
    losses = []
    for sku, e in sorted(estimates.items()):
        if (p := e.losing) is not None:
            se = p.speedup * e.noise.get(p.batch, 0.0)
            losses.append(f"{sku}: speedup {p.speedup:.2f} +/- {se:.2f} at batch {p.batch}")
    return (
        f"speculation clearly loses from batch {below} ({'; '.join(losses)}): exploring it "
        f"only below {below} from now"
    )


def past_range(window: FleetWindow, below: int | None) -> int | None:
    """The smallest bucket traffic reached (`common_buckets`) when none is below the explored
    range's end `below`: a calibration with nothing to explore; else None."""
    reached = [b for stats in window.steps.values() for b in common_buckets(stats)]
    if below is None or not reached or min(reached) < below:
        return None
    return min(reached)


def _kept_past_range(
    spec: SpecDeploymentSpec, state: State, obs: Observation, window: FleetWindow, lowest: int
) -> Step:
    """Traffic ran only past the range the calibration explores speculation in: for a traffic
    shift, it moved the crossover by less than that; once speculation clearly lost from the
    range's end on every SKU, it paid at no batch traffic ran at. The thresholds in force stand
    there. The baseline takes the new traffic, so that the same shift does not start the same
    calibration again; the fleet it records (replicas, SKUs) and what was found per SKU (bounds,
    floors, outcomes) stand with the thresholds: a fleet change meanwhile still re-measures. A
    first calibration (narrowed on an early read, whose window reached back before it started,
    the loss then left its window) records a fresh one: speculation paid at no batch measured,
    and traffic running below the range's end or a lower threshold re-measures."""
    cal = state.calibration
    below = cal.exploreBelow
    assert below is not None and cal.config is not None
    runs = {sku: thresholds_by_sku(state).get(sku, state.threshold.current) for sku in window.skus}
    measured = {"measuredAt": _iso(obs.now), "traffic": _traffic_dict(window.traffic)}
    if cal.baseline is not None:
        baseline = cal.baseline.model_copy(update=measured)
    else:
        lowest_threshold = spec.speculation.threshold.min
        floors = {sku: below if t is None else min(below, t) for sku, t in runs.items()}
        baseline = Baseline(
            replicas=obs.replicas,
            skus=sorted(window.skus),
            **cal.config.model_dump(),
            **measured,
            floors={sku: f for sku, f in floors.items() if f > lowest_threshold},
            outcomes=dict.fromkeys(window.skus, "never_pays"),
        )
    update = {"baseline": baseline, "failures": 0}
    kept = dataclasses.replace(state, calibration=cal.model_copy(update=update))
    said = ", ".join(f"{sku} {t}" for sku, t in sorted(runs.items()))
    why = (
        f"traffic ran at batch {lowest} and up, past the batches this calibration explores "
        f"speculation at (below {below}): the thresholds in force stand ({said})"
    )
    return _finish(kept, obs.now, Event("ThresholdKept", why))


def too_noisy(estimates: Mapping[str, Estimate]) -> str | None:
    """What makes a calibration too noisy to decide on (the estimates whose confidence is
    below MIN_CONFIDENCE, their noisiest deciding bucket), or None."""
    said = []
    for sku, e in estimates.items():
        if e.confidence < MIN_CONFIDENCE and (noisiest := e.noisiest) is not None:
            point, se = noisiest
            said.append(
                f"{sku}: speedup {point.speedup:.2f} +/- {point.speedup * se:.2f} at batch "
                f"{point.batch}, confidence {e.confidence:.0%}"
            )
    return "; ".join(said) or None


def _covered(
    before: Baseline | None, estimates: Mapping[str, Estimate], local: bool = False
) -> dict[str, list[int]]:
    """SKU -> the smallest and largest bucket measured in both modes: this calibration's for
    the SKUs it measured, the last one's for the others (their thresholds stand too). A `local`
    calibration (a traffic trigger's: near the thresholds, or below a floor) leaves the last
    one's measurement standing outside its range, so the ranges join: a floor calibration that
    measured 2-6 under a range of 8-64 covers 2-64, and a replica change that keeps each pod at
    batch 30 re-measures nothing (`replicas_changed`; it re-measured every batch, spectune-sim's
    hpa-load-waves)."""
    kept = dict(before.covered or {}) if before is not None else {}
    measured = {s: [e.curve[0].batch, e.curve[-1].batch] for s, e in estimates.items() if e.curve}
    if local:
        measured = {
            s: [min(low, kept[s][0]), max(high, kept[s][1])] if s in kept else [low, high]
            for s, (low, high) in measured.items()
        }
    return kept | measured


def _outcomes(before: Baseline | None, estimates: Mapping[str, Estimate]) -> dict[str, Outcome]:
    """SKU -> what this calibration found for the SKUs it measured (each estimate known), the
    last one's for the others (their thresholds stand too)."""
    kept: dict[str, Outcome] = dict(before.outcomes) if before is not None else {}
    return kept | {s: e.crossover.status for s, e in estimates.items()}


def _floor(estimate: Estimate, runs: int | None, covered: Sequence[int] | None) -> int | None:
    """Below which batch a SKU's traffic is unmeasured after a calibration that measured
    speculation paying at no batch: its smallest measured batch, or the threshold the SKU keeps
    where that is lower and the standing measurement (`covered`, the smallest and largest
    bucket measured in both modes) reaches down to it: batches between them were measured, and
    run plain, the side that costs no more than the speedup a re-measure could find. A lower
    threshold that no standing measurement reaches is no evidence: a threshold of 1 left from a
    noisy calibration, kept because "does not pay from 24 up" agrees with it, never speculated
    at batches 1-16 where speculation paid, and nothing re-measured them (an e2e on a busy
    machine). None for other curves."""
    floor = estimate.floor
    if floor is None or runs is None or runs >= floor:
        return floor
    return runs if covered is not None and covered[0] <= runs else floor


def _pods_by_sku(window: FleetWindow) -> dict[str, int]:
    out: dict[str, int] = {}
    for engine in window.engines.values():
        out[engine.device] = out.get(engine.device, 0) + 1
    return out


def _decide(
    spec: SpecDeploymentSpec,
    state: State,
    obs: Observation,
    window: FleetWindow,
    estimates: dict[str, Estimate],
) -> Step:
    """Damp each SKU's measured threshold; Auto applies the moves, Advisory reports them."""
    t = spec.speculation.threshold
    cal, now = state.calibration, obs.now
    last_change = _time(cal.changedAt) if cal.changedAt else None
    dwell = timedelta(seconds=spec.tuning.minDwellSeconds)
    pods = _pods_by_sku(window)
    old = thresholds_by_sku(state)
    measured_before = state.threshold.source == "Measured"
    auto = t.mode == "Auto"
    per_sku, events, changed, waiting = [], [], False, False
    targets: dict[str, int | None] = {}  # per SKU: what the threshold should be
    for sku, est in estimates.items():
        current = old.get(sku, state.threshold.current)
        unmeasured = sku not in old and not measured_before
        # a threshold an earlier calibration measured stands where this one measured only
        # one side of the crossover and agrees with it. A start value is a guess that a bound
        # moves; but paying at no measured batch never raises one: that would speculate at
        # the unmeasured batches below them (16 -> 128 when a busy fleet ran only at 128,
        # spectune-sim). Damping still clamps it into the spec's range.
        asked = clamp(est.threshold, t.min, t.max)
        kept_as_measured = sku in old or est.crossover.status == "never_pays"
        agrees = kept_as_measured and asked != current and est.agrees_with(current)
        targets[sku] = current if agrees else asked
        clear = est.flips_a_clear_bucket(current, targets[sku])
        damped = damp(
            current,
            targets[sku],
            t.min,
            t.max,
            None if unmeasured else last_change,
            now,
            dwell,
            dead_band_buckets=0 if clear else est.dead_band,
        )
        if agrees:
            what = "measured earlier"
            if sku not in old:  # a SKU new to a measured deployment runs the deployment's
                what = "the deployment's threshold" if measured_before else "the start value"
            damped = dataclasses.replace(
                damped,
                message=f"{current}, {what}, stands: it agrees with this one-sided measurement",
            )
        move = auto and damped.action == "change"
        changed |= move
        waiting |= auto and damped.action == "wait"
        per_sku.append(
            SkuThreshold(
                sku=sku,
                threshold=damped.threshold if move else current,
                batchSize=round(est.crossover.batch) if est.crossover.status == "crosses" else None,
                reason=est.reason,
                confidencePercent=round(est.confidence * 100),
                pods=pods.get(sku, 0),
                curve=est.compact_curve(),
                measuredAt=_iso(now),
            )
        )
        verb = "ThresholdChanged" if move else "ThresholdKept"
        if not auto:
            verb = "ThresholdRecommended"
        events.append(Event(verb, f"{sku}: {damped.message} ({est.reason})"))
    # SKUs this window did not see (pods unscraped, or scaled away for now) keep theirs, with
    # the pods they run on now: the ConfigMap carries the SKU most pods run on, and a SKU left
    # with none must not win it from the one they moved to (every engine reloads that file)
    unseen = [
        p.model_copy(update={"pods": pods.get(p.sku, 0)})
        for p in state.per_sku
        if p.sku not in estimates
    ] if measured_before else []  # fmt: skip
    runs = {p.sku: p.threshold for p in per_sku}  # what each measured SKU runs from now
    main = max(per_sku, key=lambda s: (s.pods, s.sku))  # the crossover this window measured
    main_estimate = estimates[main.sku]
    per_sku += unseen
    deployment = max(per_sku, key=lambda s: (s.pods, s.sku))  # what the ConfigMap carries
    threshold = ThresholdStatus(
        current=deployment.threshold if auto else state.threshold.current,
        recommended=targets[main.sku],
        source="Measured" if auto and (changed or measured_before) else state.threshold.source,
    )
    crossover = CrossoverStatus(
        batchSize=main.batchSize,
        measuredAt=_iso(now),
        reason=main_estimate.reason,
        sku=main.sku,
        replicas=obs.replicas,
        curve=main_estimate.compact_curve(),
    )
    key = cal.config or SpeculationKey(**dataclasses.asdict(SpecKey.of(spec)))
    covered = _covered(cal.baseline, estimates, local=cal.trigger == "Traffic")
    baseline = Baseline(
        replicas=obs.replicas,
        skus=sorted(window.skus),
        model=key.model,
        draft=key.draft,
        method=key.method,
        k=key.k,
        measuredAt=_iso(now),
        traffic=_traffic_dict(window.traffic),  # the load the crossover was measured under
        bounds={
            sku: e.bound
            for sku, e in estimates.items()
            if e.bound is not None and e.bound < t.max  # at max, larger batches change nothing
        },
        # at min, smaller batches change nothing
        floors={
            sku: floor
            for sku, e in estimates.items()
            if (floor := _floor(e, runs[sku], covered.get(sku))) is not None and floor > t.min
        },
        covered=covered,
        outcomes=_outcomes(cal.baseline, estimates),
    )
    # A move the dwell holds back leaves the last measurement the baseline: whatever started
    # this calibration still stands against it, so it starts another once the dwell has passed
    # (`retryAfter`), and the move is made on a fresh measurement. Recorded as this one's, it
    # would answer the trigger and the threshold would run against its own measurement until
    # the next one (19 minutes of speculating where drafting had collapsed, 24 where 6 was
    # measured, after a rollback had restarted the dwell; spectune-sim).
    update: dict[str, object] = {"failures": 0} | ({} if waiting else {"baseline": baseline})
    if changed:
        before_thresholds = {sku: old.get(sku, state.threshold.current) for sku in window.steps}
        update |= {
            "phase": "Verifying",
            "changedAt": _iso(now),
            "beforeSteps": _old_mode_sums(window.steps, before_thresholds),
            "previous": list(state.per_sku) if measured_before else [],
            "previousThreshold": state.threshold,
            "unverified": None,
        }
    new = State(
        threshold=threshold,
        crossover=crossover,
        per_sku=tuple(per_sku),
        calibration=cal.model_copy(update=update),
    )
    if changed:
        return Step(new, tuple(events))
    due = _iso(last_change + dwell) if waiting and last_change is not None else None
    return _finish(new, now, *events, retry_after=due)


def _verify(spec: SpecDeploymentSpec, state: State, obs: Observation, window: FleetWindow) -> Step:
    """Keep the change once goodput did not fall beyond noise; put the old thresholds back
    when it did, or when no verdict comes within `VERIFY_WINDOWS` windows."""
    cal = state.calibration
    assert cal.changedAt is not None
    elapsed = (obs.now - _time(cal.changedAt)).total_seconds()
    if elapsed < spec.tuning.calibrationWindowSeconds:
        return Step(state)
    before = _traffic(cal.before)
    if before is None:
        check = GoodputCheck("unknown", "no traffic was recorded before the change")
        warned: tuple[Event, ...] = ()
    else:
        history = [t for at, t in obs.recent if at <= _time(cal.startedAt or cal.changedAt)]
        check = verdict(before, _sums(cal.beforeSteps), window, _moves(state), [*history, before])
        queueing = queueing_warning(before, window.traffic)
        warned = (Event("SpeculationQueueing", queueing, warning=True),) if queueing else ()
    if check.verdict == "keep":
        return _finish(state, obs.now, *warned, Event("ThresholdVerified", check.message))
    if check.verdict == "roll_back":
        return _roll_back(spec, state, obs.now, check.message, *warned)
    return _unverified(spec, state, obs.now, check.message, *warned)


def verdict(
    before: Traffic,
    before_steps: ServedByBucket,
    after: FleetWindow,
    moves: Mapping[str, tuple[int | None, int | None]],
    history: Sequence[Traffic] = (),
) -> GoodputCheck:
    """The goodput check of a change: the window before it against the window since, judged
    in the buckets whose mode the per-SKU threshold `moves` (old, new) flipped, with the noise
    the windows before it (`history`, oldest first, `before` last) showed."""

    def flipped(sku: str, bucket: int) -> bool:
        """Whether some batch of `bucket` runs the other mode now (None: above every batch)."""
        old, new = moves.get(sku, (None, None))
        low, high = sorted(math.inf if t is None else t for t in (old, new))
        end = next((b for b in BATCH_BUCKETS if b > bucket), math.inf)  # the next bucket's edge
        return bucket < high and end > low

    decode = same_mix_speedup(before_steps, served(after.steps), flipped)
    less = all(
        (math.inf if new is None else new) <= (math.inf if old is None else old)
        for old, new in moves.values()
    )
    return compare_goodput(before, after.traffic, decode, history, speculates_less=less)


def _moves(state: State) -> dict[str, tuple[int | None, int | None]]:
    """SKU -> (threshold before the change, threshold now) for the change being verified."""
    cal = state.calibration
    before = {p.sku: p.threshold for p in cal.previous}
    old = cal.previousThreshold.current if cal.previousThreshold is not None else None
    return {p.sku: (before.get(p.sku, old), p.threshold) for p in state.per_sku}


def _unverified(
    spec: SpecDeploymentSpec, state: State, now: datetime, why: str, *events: Event
) -> Step:
    """No verdict yet: verification goes on (one Event says so) until `VERIFY_WINDOWS`
    windows after the change, then the change is rolled back: kept only on evidence."""
    cal = state.calibration
    assert cal.changedAt is not None
    window = timedelta(seconds=spec.tuning.calibrationWindowSeconds)
    deadline = _time(cal.changedAt) + VERIFY_WINDOWS * window
    if now >= deadline:
        return _roll_back(spec, state, now, f"not verified within {VERIFY_WINDOWS} windows: {why}")
    if now - _time(cal.changedAt) < window:
        return Step(state, events)  # the first verdict is not due yet
    if cal.unverified is None:
        until = f"until {_iso(deadline)}, then rolled back unless a check decides"
        events += (Event("VerificationExtended", f"{why}: verification goes on {until}"),)
    extended = dataclasses.replace(state, calibration=cal.model_copy(update={"unverified": why}))
    return Step(extended, events)


def _roll_back(
    spec: SpecDeploymentSpec, state: State, now: datetime, why: str, *events: Event
) -> Step:
    """The thresholds before the change, and where they came from (a spec value given back
    to the spec), with the new measurement kept as the recommendation."""
    cal = state.calibration
    previous = tuple(cal.previous)
    before = cal.previousThreshold or state.threshold
    threshold = before.model_copy(update={"recommended": state.threshold.recommended})
    rolled = State(
        threshold=threshold,
        crossover=state.crossover,
        per_sku=previous,
        calibration=cal.model_copy(update={"changedAt": _iso(now)}),
    )
    back = ", ".join(f"{s.sku} {s.threshold}" for s in previous) or f"{threshold.current}"
    rolled_back = Event("RolledBack", f"{why}: back to {back}", warning=True)
    return _give_up(spec, rolled, now, *events, rolled_back)


def calibrated(spec: SpecDeploymentSpec, state: State) -> tuple[bool, str, str]:
    """The Calibrated condition: (ok, reason, message)."""
    mode = spec.speculation.threshold.mode
    cal = state.calibration
    if mode == "Manual":
        return False, "Manual", "threshold pinned by spec.speculation.threshold.value"
    if cal.phase == "Idle" and cal.failures:
        ran = "the last calibration" if cal.failures == 1 else f"{cal.failures} calibrations"
        message = (
            f"{ran} in a row measured nothing ({cal.message}); the next starts after "
            f"{cal.retryAfter} at the earliest, each waiting twice as long as the last (up to "
            "tuning.maxAgeSeconds)"
        )
        return cal.baseline is not None, "CalibrationFailing", message
    if cal.baseline is None:
        if cal.phase == "Exploring":
            return False, "Calibrating", cal.message or ""
        return False, "NotMeasured", "no crossover measured yet"
    if cal.phase == "Exploring":  # the last measurement stays in force meanwhile
        return True, "Recalibrating", cal.message or ""
    summary = ", ".join(f"{s.sku}: threshold {s.threshold} ({s.reason})" for s in state.per_sku)
    return True, "Recommended" if mode == "Advisory" else "Measured", summary
