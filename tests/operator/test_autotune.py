"""The calibration state machine without a cluster: every trigger starts a calibration that
names it, exploration is raised only while exploring, Auto moves the threshold to the measured
crossover (per SKU), Advisory only recommends, Manual is never touched, a goodput drop rolls the
change back, Prometheus going away ends a calibration with the threshold kept, and changes are
damped."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

import pytest

from spectune.engine.crossover import ModeStats, StatsByBucket
from spectune.operator import autotune, tuning
from spectune.operator.autotune import (
    CALIBRATION_EXPLORATION_PERCENT,
    Observation,
    State,
    engine_settings,
    step,
    window_seconds,
)
from spectune.operator.estimator import estimate_by_sku
from spectune.operator.models import (
    CalibrationStatus,
    SkuThreshold,
    ThresholdStatus,
    TuningSpec,
)
from spectune.operator.observations import FleetWindow, Traffic, served

from .machine import (
    BUCKETS,
    H100,
    L4,
    T0,
    WINDOW,
    curve,
    elsewhere,
    fresh,
    observe,
    spec,
    traffic,
    window,
)

# decode steps at batch 16 in plain mode only: traffic there, not yet measured in both modes
PLAIN_16 = {("plain", 16): ModeStats(100, 1600, 0.5)}


def reasons(result: autotune.Step) -> list[str]:
    return [e.reason for e in result.events]


def thresholds(state: State) -> dict[str, int | None]:
    return {p.sku: p.threshold for p in state.per_sku}


def calibrate(s, state: State, start: float, stats: dict[str, StatsByBucket], **kw) -> State:
    """Run one calibration from Idle to its decision; the state after the decision. `noise`:
    every bucket's throughput error in the window, as measured from its batches."""
    pods, noise = kw.pop("pods", None), kw.pop("noise", None)
    started = step(s, state, observe(start, window(kw.pop("before", {}), pods), **kw))
    assert started.state.calibration.phase == "Exploring", started
    explored = window(stats, pods)
    if noise is not None:
        explored = dataclasses.replace(
            explored, noise={sku: dict.fromkeys(st, noise) for sku, st in stats.items()}
        )
    return step(s, started.state, observe(start + WINDOW, explored, **kw)).state


def test_a_fresh_auto_deployment_calibrates_and_moves_to_the_crossover() -> None:
    s = spec()
    state = fresh(s)
    assert engine_settings(s, state, H100) == (4, 2)
    unsettled = Observation(T0, 1, False, window())
    assert step(s, state, unsettled).state == state  # no calibration mid-rollout
    started = step(s, state, observe(0, window()))
    assert reasons(started) == ["CalibrationStarted"]
    assert "no crossover measured yet" in started.events[0].message
    state = started.state
    assert state.calibration.trigger == "Initial"
    assert engine_settings(s, state, H100) == (4, CALIBRATION_EXPLORATION_PERCENT)
    assert autotune.calibrated(s, state)[:2] == (False, "Calibrating")
    # still undersampled and the window has not ended: keep exploring
    thin = step(s, state, observe(20, window({H100: curve(12, steps=5)})))
    assert thin.events == () and thin.state.calibration.phase == "Exploring"
    assert thin.state.calibration.reached == {H100: [1, 48]}
    decided = step(s, state, observe(30, window({H100: curve(12)})))
    assert reasons(decided) == ["ThresholdChanged"]
    assert "4 -> 12" in decided.events[0].message
    state = decided.state
    assert state.threshold == ThresholdStatus(current=12, recommended=12, source="Measured")
    assert state.crossover.batchSize == 12 and state.crossover.sku == H100
    # the measured curve, per SKU and for the main one: bucket -> speedup, (12 / b) ** 0.3 here
    expected = {str(b): round((12 / b) ** 0.3, 3) for b in BUCKETS}
    assert state.crossover.curve == expected and state.per_sku[0].curve == expected
    assert state.calibration.phase == "Verifying"
    assert engine_settings(s, state, H100) == (12, 2)  # exploration back at its base
    assert engine_settings(s, state, None) == (12, 2)  # the ConfigMap
    ok, why, message = autotune.calibrated(s, state)
    assert ok and why == "Measured" and "threshold 12" in message
    kept = step(s, state, observe(30 + WINDOW, window({H100: curve(12)})))
    assert reasons(kept) == ["ThresholdVerified"]
    assert kept.state.calibration.phase == "Idle" and kept.state.threshold.current == 12


def test_by_default_a_threshold_speculates_only_where_speculation_gains_5_percent() -> None:
    """A curve crossing 1.0 at 12, 1.05 at 10.4: the default spec asks for 11; a spec that
    asks for no gain, 12. Goodput counts requests against a per-request TPOT, which
    speculation spreads: where it gains less, plain decoding served more within the SLO."""
    default = TuningSpec().requiredGainPercent
    assert default == 5
    for gain, threshold in ((default, 11), (0, 12)):
        s = spec(requiredGainPercent=gain)
        state = calibrate(s, fresh(s), 0, {H100: curve(12)})
        assert state.threshold.current == threshold, gain


def test_the_window_ends_the_collection_even_when_buckets_lack_samples() -> None:
    s = spec()
    state = step(s, fresh(s), observe(0, window())).state
    # batch 16 in 12% of the steps, nearly all of them speculating: never 20 plain ones (no
    # bucket below it loses clearly, so the calibration waits for it)
    thin = curve(12, buckets=BUCKETS[:7]) | {
        ("spec", 16): ModeStats(300, 9600, 1),
        ("plain", 16): ModeStats(5, 80, 0),
    }
    waiting = step(s, state, observe(WINDOW - 1, window({H100: thin})))
    assert waiting.events == () and waiting.state.calibration.phase == "Exploring"
    done = step(s, state, observe(WINDOW, window({H100: thin})))
    assert done.state.threshold.current == 12


def test_a_calibration_too_noisy_to_decide_explores_on_then_decides() -> None:
    """Confidence decides: the window's batches measured each bucket's throughput to 6% a
    mode, so each speedup is known to 8.5% and a 10% step is about one standard error. The
    calibration does not move the threshold at its window's end: it explores on, says so once,
    and decides on what it has at two windows. Measured to 0.5%, it decides at once."""
    s = spec()
    state = step(s, fresh(s), observe(0, window())).state

    def measured(noise: float) -> FleetWindow:
        by_bucket = {(m, b): noise for m in ("spec", "plain") for b in BUCKETS}
        # up to 24: none of these buckets loses clearly at 6% noise, so exploring goes on there
        stats = curve(12, buckets=BUCKETS[:-2])
        return dataclasses.replace(window({H100: stats}), noise={H100: by_bucket})

    assert step(s, state, observe(30, measured(0.06))).events == ()  # within its window
    extended = step(s, state, observe(WINDOW, measured(0.06)))
    assert reasons(extended) == ["CalibrationExtended"]
    message = extended.events[0].message
    assert f"{H100}: speedup" in message and "confidence 20%" in message, message
    assert f"up to {autotune.EXTENDED_WINDOWS * WINDOW} s" in message, message
    assert extended.state.calibration.phase == "Exploring"
    assert extended.state.calibration.extendedAt is not None
    again = step(s, extended.state, observe(WINDOW + 10, measured(0.06)))
    assert again.events == () and again.state == extended.state  # said once
    decided = step(s, extended.state, observe(autotune.EXTENDED_WINDOWS * WINDOW, measured(0.06)))
    assert reasons(decided) == ["ThresholdChanged"]
    assert decided.state.per_sku[0].confidencePercent == 20
    quiet = step(s, state, observe(30, measured(0.005)))
    assert reasons(quiet) == ["ThresholdChanged"]
    assert quiet.state.per_sku[0].confidencePercent == 100


def test_no_measurement_keeps_the_threshold_and_retries_after_a_window() -> None:
    s = spec()
    state = calibrate(s, fresh(s), 0, {})
    assert state.calibration.phase == "Idle" and state.threshold.current == 4
    assert state.calibration.baseline is None
    assert step(s, state, observe(WINDOW + 30, window())).state == state  # backing off
    retry = step(s, state, observe(2 * WINDOW, window()))
    assert reasons(retry) == ["CalibrationStarted"]


def test_advisory_recommends_and_changes_nothing_on_the_pods() -> None:
    s = spec("Advisory")
    state = calibrate(s, fresh(s), 0, {H100: curve(12)})
    assert state.threshold == ThresholdStatus(current=4, recommended=12, source="Spec")
    assert state.calibration.phase == "Idle"
    assert engine_settings(s, state, H100) == (4, 2)
    assert autotune.calibrated(s, state)[:2] == (True, "Recommended")


def test_manual_is_never_touched() -> None:
    s = spec("Manual", 6)
    state = fresh(s)
    assert step(s, state, observe(0, window({H100: curve(12)}))).state == state
    assert engine_settings(s, state, H100) == (6, 2)
    # a calibration left over from Auto ends, and exploration goes back to its base
    exploring = step(spec(), fresh(spec()), observe(0, window())).state
    ended = step(s, exploring, observe(10, window()))
    assert reasons(ended) == ["CalibrationCancelled"]
    assert engine_settings(s, ended.state, H100)[1] == 2


def test_prometheus_gone_mid_calibration_keeps_the_threshold_and_lowers_exploration() -> None:
    s = spec()
    exploring = step(s, fresh(s), observe(0, window())).state
    gone = step(s, exploring, observe(20, None, error="connection refused"))
    assert reasons(gone) == ["CalibrationAborted"] and gone.events[0].warning
    assert "connection refused" in gone.events[0].message
    assert engine_settings(s, gone.state, H100) == (4, 2)
    assert step(s, gone.state, observe(30, None)).state == gone.state  # idle: wait
    back = step(s, gone.state, observe(20 + WINDOW, window()))
    assert reasons(back) == ["CalibrationStarted"]  # recovers by itself


def test_an_slo_met_share_drop_beyond_noise_rolls_back() -> None:
    s = spec()
    state = step(s, fresh(s), observe(0, window(load=traffic(slo_met_share=0.95)))).state
    state = step(s, state, observe(30, window({H100: curve(12)}))).state
    assert state.threshold.current == 12
    worse = window({H100: curve(12)}, load=traffic(slo_met_share=0.7))
    rolled = step(s, state, observe(30 + WINDOW, worse))
    assert reasons(rolled) == ["RolledBack"] and rolled.events[0].warning
    assert rolled.state.threshold.current == 4
    assert engine_settings(s, rolled.state, H100) == (4, 2)
    assert rolled.state.calibration.phase == "Idle"


def test_a_rollback_backs_off_a_verified_change_does_not() -> None:
    """A fleet change right after a verified calibration is looked at in the next reconcile;
    after a rollback (nothing measured was kept) the next trigger waits one window."""
    s = spec()
    verified = measured(s)  # Idle at T0 + 120 s
    assert verified.calibration.retryAfter is None
    scaled = step(s, verified, observe(2 * WINDOW + 10, window(elsewhere()), replicas=3))
    assert scaled.state.calibration.trigger == "Replicas"
    state = step(s, fresh(s), observe(0, window(load=traffic(slo_met_share=0.95)))).state
    state = step(s, state, observe(30, window({H100: curve(12)}))).state
    worse = window({H100: curve(12)}, load=traffic(slo_met_share=0.7))
    rolled = step(s, state, observe(30 + WINDOW, worse)).state
    assert rolled.calibration.retryAfter is not None
    assert step(s, rolled, observe(40 + WINDOW, window(elsewhere()), replicas=3)).state == rolled
    retried = step(s, rolled, observe(30 + 2 * WINDOW, window(elsewhere()), replicas=3))
    assert retried.state.calibration.trigger == "Replicas"


def test_the_calibrations_own_window_does_not_count_as_traffic_past_its_bound() -> None:
    """A calibration kept 24 (speculation pays through bucket 16); right after it, the window
    still holds its own steps, so the past-bound trigger judges only windows wholly after it."""
    s = spec(value=24)
    small = (1, 2, 4, 8, 16)
    state = calibrate(s, fresh(s), 0, {H100: curve(100, buckets=small)})
    assert state.calibration.phase == "Idle" and state.threshold.current == 24
    most = window({H100: curve(100, buckets=(1, 2)) | curve(100, buckets=(24, 32, 48))})
    assert step(s, state, observe(WINDOW + 10, most)).state == state
    started = step(s, state, observe(2 * WINDOW, most))
    assert started.state.calibration.trigger == "Traffic"


def ran(crossover: float, threshold: int, steps: dict[int, int]) -> StatsByBucket:
    """What engines whose true curve crosses at `crossover` decode under `threshold` (no
    exploration): `steps[b]` steps at bucket b, in the mode the threshold picks there."""
    truth = curve(crossover, steps=1)
    out: StatsByBucket = {}
    for b, n in steps.items():
        mode = "spec" if b < threshold else "plain"
        one = truth[(mode, b)]
        out[(mode, b)] = ModeStats(n, n * one.tokens, n * one.seconds)
    return out


QUIET_MIX = {1: 300, 2: 300, 4: 200, 8: 200, 16: 50, 32: 20}
BUSY_MIX = {1: 20, 2: 20, 4: 50, 8: 200, 16: 300, 32: 300}


def moved(s, before: FleetWindow, measured: StatsByBucket) -> State:
    """A calibration started over `before`, decided on `measured`: verifying its move."""
    state = step(s, fresh(s), observe(0, before)).state
    return step(s, state, observe(30, window({H100: measured}))).state


def test_a_move_that_pays_is_kept_while_the_batch_mix_moves() -> None:
    """4 -> 12 where the crossover is 12, verified while the load fell from large batches to
    small ones: tokens per busy second fell with the batches (by more than half), and the
    same mix compares only the threshold's effect: faster, kept."""
    s = spec()
    before = window({H100: ran(12, 4, BUSY_MIX)})
    state = moved(s, before, curve(12))
    assert state.threshold.current == 12
    after = window({H100: ran(12, 12, QUIET_MIX)})

    def tokens_per_busy_second(w: FleetWindow) -> float:
        sums = w.steps[H100].values()
        return sum(x.tokens for x in sums) / sum(x.seconds for x in sums)

    assert tokens_per_busy_second(after) < 0.5 * tokens_per_busy_second(before)
    verified = step(s, state, observe(30 + WINDOW, after))
    assert reasons(verified) == ["ThresholdVerified"]
    assert "decode throughput on the same batch mix x1.25 where it flipped" in (
        verified.events[0].message
    )  # buckets 4-8 only: 12 and up ran plain before and after
    assert verified.state.threshold.current == 12


def test_a_bad_estimate_is_rolled_back_on_decode_throughput() -> None:
    """An estimate forced to 52 where speculation stops paying at 12: batches 12-51 now
    speculate and decode slower; rolled back though the SLO-met share held."""
    s = spec()
    # what the calibration read: the truth where the threshold before it speculated (1, 2),
    # speculation paying everywhere else (a bad read the goodput check must catch)
    bad = curve(48, buckets=(4, 8, 16, 32, 64)) | curve(12, buckets=(1, 2))
    state = moved(s, window({H100: ran(12, 4, QUIET_MIX)}), bad)
    assert state.threshold.current == 52  # the crossover read between 32 and 64
    after = window({H100: ran(12, 52, BUSY_MIX)})
    rolled = step(s, state, observe(30 + WINDOW, after))
    assert reasons(rolled) == ["RolledBack"]
    assert rolled.events[0].message.startswith("decode throughput on the same batch mix fell")
    assert rolled.state.threshold.current == 4


def test_a_change_is_judged_where_the_load_before_the_calibration_never_ran() -> None:
    """A load that rose past a bound (the demo's busy phase after its quiet one): the window
    before the calibration holds batches 1-4 only, and 2.5x fewer requests. The buckets the
    change flips were measured in the calibration's window, in the mode the old threshold ran
    there: that is the rate the check compares with, so the change is judged, not left
    without a verdict and rolled back three windows later."""
    s = spec()
    quiet = window({H100: ran(40, 4, {1: 300, 2: 300, 4: 200})})
    state = moved(s, quiet, curve(40, buckets=(4, 8, 16, 32, 64)))
    assert state.threshold.current == 44  # the crossover read between 32 and 64
    busy = window({H100: ran(40, 44, {8: 100, 16: 300, 32: 300})}, load=traffic(rate=25.0))
    verified = step(s, state, observe(30 + WINDOW, busy))
    assert reasons(verified) == ["ThresholdVerified"], verified.events
    assert "where it flipped" in verified.events[0].message


def test_a_move_among_batches_the_traffic_does_not_make_is_verified() -> None:
    """The demo's quiet phase: a few clients make batches of 1-2, where speculation pays, and
    the start value 8 moves to 3, just past them. That flips buckets 3-6 only, where no batch
    runs: every step runs the mode it ran before, so the first check keeps the move, though
    too few requests came for the SLO-met share to judge (a clean-clone CI run rolled it back
    three windows later when only flipped buckets with steps could keep a change)."""
    s = spec(value=8)
    few, load = {1: 300, 2: 300}, traffic(rate=0.5)
    started = step(s, fresh(s), observe(0, window({H100: ran(40, 8, few)}, load=load))).state
    state = step(s, started, observe(WINDOW, window({H100: curve(40, buckets=(1, 2))}))).state
    assert state.threshold.current == 3 and state.calibration.phase == "Verifying"
    after = window({H100: ran(40, 3, few)}, load=load)
    verified = step(s, state, observe(2 * WINDOW, after))
    assert reasons(verified) == ["ThresholdVerified"], verified.events
    assert "no batch since ran in a bucket the change flipped" in verified.events[0].message
    assert verified.state.threshold.current == 3


def test_a_bound_waits_for_the_batch_range_to_settle_a_crossing_does_not() -> None:
    """Every bucket sampled, speculation paying up to batch 16: the load may not have come
    round to larger batches yet, so exploring goes on until the range of batches reached has
    not grown for a quarter of the window (15 s of 60); a curve that crosses is decided as soon
    as its buckets are sampled."""
    s = spec()
    exploring = step(s, fresh(s), observe(0, window())).state
    small = (1, 2, 4, 8, 16)
    bound = window({H100: curve(100, buckets=small)})
    seen = step(s, exploring, observe(10, bound))
    assert (
        seen.events == ()
        and seen.state.calibration.reachedAt == (T0 + timedelta(seconds=10)).isoformat()
    )
    assert step(s, seen.state, observe(24, bound)).state.calibration.phase == "Exploring"
    ended = step(s, seen.state, observe(25, bound))
    assert "ThresholdChanged" in reasons(ended)
    assert ended.state.threshold.current == 24  # through bucket 16 and no further
    # the load reaches batch 32 at 20 s: the range grew, and its 15 s start again
    grown = window({H100: curve(100, buckets=(*small, 32))})
    later = step(s, seen.state, observe(20, grown))
    assert later.state.calibration.reached == {H100: [1, 32]}
    assert step(s, later.state, observe(34, grown)).state.calibration.phase == "Exploring"
    assert step(s, later.state, observe(35, grown)).state.threshold.current == 48
    # the whole window passes with the range still growing: decided at its end all the same
    assert step(s, exploring, observe(WINDOW, bound)).state.threshold.current == 24
    crossing = step(s, exploring, observe(20, window({H100: curve(12, buckets=small)})))
    assert crossing.state.calibration.phase == "Verifying", crossing.events
    assert crossing.state.crossover.batchSize == 13  # 12.9, interpolated between 8 and 16


def test_a_bucket_traffic_rarely_reaches_does_not_hold_a_bound_up() -> None:
    """A quiet load: batch 1 in 1% of the steps, never 20 of them in a mode. Once the range
    has settled the bound is kept, measured through the buckets that hold the load."""
    s = spec(value=8)
    exploring = step(s, fresh(s), observe(0, window())).state
    quiet = curve(100, buckets=(2, 3)) | {("plain", 1): ModeStats(2, 2, 0.02)}
    seen = step(s, exploring, observe(10, window({H100: quiet}))).state
    assert seen.calibration.reached == {H100: [2, 3]}  # batch 1 is too rare to count
    # a rare batch 8 later does not restart the 15 s, nor does the range shrink when batch 2
    # turns rare in its turn
    later = curve(100, buckets=(3,)) | {("plain", 2): ModeStats(4, 8, 0.04)}
    later |= {("spec", 8): ModeStats(3, 24, 0.03)}
    seen = step(s, seen, observe(20, window({H100: later}))).state
    assert seen.calibration.reached == {H100: [2, 3]}
    assert seen.calibration.reachedAt == (T0 + timedelta(seconds=10)).isoformat()
    ended = step(s, seen, observe(25, window({H100: quiet})))
    assert ended.state.calibration.phase == "Verifying", ended.events
    assert ended.state.threshold.current == 4  # through bucket 3 and no further


def test_a_new_calibration_measures_its_batch_range_afresh() -> None:
    """The range a calibration reached is its own: the next one starts without it, so that a
    range an earlier load reached never counts as settled."""
    s = spec()
    small = (1, 2, 4, 8, 16)
    state = calibrate(s, fresh(s), 0, {H100: curve(100, buckets=small)})
    assert state.calibration.reached == {H100: [1, 16]}
    state = step(s, state, observe(2 * WINDOW, window({H100: curve(100, buckets=small)}))).state
    most = window({H100: curve(100, buckets=(1, 2)) | curve(100, buckets=(24, 32, 48))})
    started = step(s, state, observe(4 * WINDOW, most)).state
    assert started.calibration.phase == "Exploring"
    assert started.calibration.reached == {} and started.calibration.reachedAt is None


def test_traffic_past_a_bound_re_measures_the_batches_it_reaches() -> None:
    """Speculation paid at every batch up to bucket 16: it stops at 24, and once most decode
    steps run at 24 or more (mostly plain there) a calibration measures those batches."""
    s = spec()
    small = (1, 2, 4, 8, 16)
    state = calibrate(s, fresh(s), 0, {H100: curve(100, buckets=small)})
    assert state.threshold.current == 24
    assert state.calibration.baseline is not None
    assert state.calibration.baseline.bounds == {H100: 24}
    state = step(s, state, observe(2 * WINDOW, window({H100: curve(100, buckets=small)}))).state
    assert state.calibration.phase == "Idle"
    as_before = observe(4 * WINDOW, window({H100: curve(100, buckets=small)}))
    assert step(s, state, as_before).state == state
    some = window({H100: curve(100, buckets=small) | curve(100, buckets=(24,))})  # 1 in 6
    assert step(s, state, observe(4 * WINDOW, some)).state == state
    most = window({H100: curve(100, buckets=(1, 2)) | curve(100, buckets=(24, 32, 48))})
    started = step(s, state, observe(4 * WINDOW, most))
    assert started.state.calibration.trigger == "Traffic"
    assert f"{H100}: 60% of decode steps ran at batch 24 or more" in started.events[0].message


def test_traffic_below_a_floor_re_measures_the_batches_it_reaches() -> None:
    """The mirror: a busy window measured speculation paying at no batch from 32 up. From a
    start value above them (48) it turns off from 24 only, where its loss at 32 (speedup 0.71)
    bounds speedup below 1 (smaller batches still speculate, unmeasured), and once a share of
    the decode steps that is not rare runs below 24 (1 in 6), a calibration measures those
    batches, exploring speculation only below 24, where it runs anyway. A few steps do not.
    What it measured joins the range measured before."""
    s = spec(value=48)
    large = (32, 48)
    state = calibrate(s, fresh(s), 0, {H100: curve(10, buckets=large)})
    assert state.threshold.current == 24
    assert state.calibration.baseline is not None
    assert state.calibration.baseline.floors == {H100: 24}
    assert state.calibration.baseline.bounds == {}
    state = step(s, state, observe(2 * WINDOW, window({H100: curve(10, buckets=large)}))).state
    assert state.calibration.phase == "Idle"
    as_before = observe(4 * WINDOW, window({H100: curve(10, buckets=large)}))
    assert step(s, state, as_before).state == state
    busy = curve(10, buckets=(*large, 64, 96, 128))
    few = window({H100: busy | curve(10, steps=5, buckets=(16,))})
    assert step(s, state, observe(4 * WINDOW, few)).state == state  # 10 steps below: too few
    some = window({H100: busy | curve(10, buckets=(16,))})
    started = step(s, state, observe(4 * WINDOW, some))
    assert started.state.calibration.trigger == "Traffic"
    assert f"{H100}: 17% of decode steps ran below batch 24" in started.events[0].message
    assert started.state.calibration.exploreBelow == 24
    # it measures 8-16 (losing there too); the range measured before stands above them, so a
    # replica change that keeps the load at 32-48 re-measures nothing
    lower = window({H100: curve(4, buckets=(8, 12, 16))})
    decided = step(s, started.state, observe(6 * WINDOW, lower)).state
    assert decided.calibration.baseline is not None
    assert decided.calibration.baseline.covered == {H100: [8, 48]}


@pytest.mark.parametrize(
    ("buckets", "asked"),
    [((1, 2, 4), 6), ((32, 48), 32)],
    ids=["load fell: pays at every batch it reaches", "load rose: pays at none"],
)
def test_a_load_away_from_a_measured_crossover_keeps_it(buckets, asked) -> None:
    """A crossing measured at 20 (threshold 21) stands when a later calibration (here the
    replicas changed) sees traffic only on one side of it: paying at every batch up to 4, or at
    none from 32, says nothing against 21, so the threshold does not follow the load there and
    back. The bound still tells the past-bound trigger where the measured batches end; the
    floor tells its mirror where they start now (32: the replica calibration's range replaced
    the one that measured 21, so traffic back below 32 measures it again, issue 59, O)."""
    s = spec(minDwellSeconds=0)
    state = measured(s, crossover=20)
    assert (state.threshold.current, state.threshold.source) == (21, "Measured")
    started = step(s, state, observe(3 * WINDOW, window(elsewhere()), replicas=3))
    assert started.state.calibration.phase == "Exploring"
    one_side = window({H100: curve(20, buckets=buckets)}, load=traffic(rate=3.0))
    decided = step(s, started.state, observe(4 * WINDOW, one_side, replicas=3))
    assert reasons(decided) == ["ThresholdKept"], decided.events
    assert "21, measured earlier, stands" in decided.events[0].message
    after = decided.state
    assert after.threshold.current == after.threshold.recommended == 21
    assert [p.threshold for p in after.per_sku] == [21]
    assert after.calibration.baseline is not None
    one_sided = after.calibration.baseline.bounds | after.calibration.baseline.floors
    assert one_sided == {H100: asked}


def test_a_one_sided_measurement_still_moves_a_start_value() -> None:
    """The spec's start value was never measured: a bound moves it as far as it asks."""
    s = spec(value=64, minDwellSeconds=0)
    state = calibrate(s, fresh(s), 0, {H100: curve(20, buckets=(1, 2, 4))})
    assert state.threshold.current == 6


def test_paying_at_no_measured_batch_never_raises_a_start_value() -> None:
    """A busy fleet measured only at 128, where speculation does not pay: the start value 16
    stands (raising it to 128 would speculate at every unmeasured batch below 128), and the
    floor trigger watches the batches the measurement did not reach."""
    s = spec(value=16, minDwellSeconds=0)
    state = fresh(s)
    started = step(s, state, observe(WINDOW, window({H100: curve(10, buckets=(128,))})))
    assert started.state.calibration.phase == "Exploring"
    decided = step(s, started.state, observe(2 * WINDOW, window({H100: curve(10, buckets=(128,))})))
    assert reasons(decided) == ["ThresholdKept"], decided.events
    assert "16, the start value, stands" in decided.events[0].message
    after = decided.state
    assert (after.threshold.current, after.threshold.source) == (16, "Spec")
    assert after.calibration.baseline is not None
    # speculation runs unmeasured below 16, and the batches from 16 to 63 (its loss at 128
    # bounds speedup below 1 from 64) run plain by a start value no measurement reached:
    # traffic below 64 measures them (issue 59, O)
    assert after.calibration.baseline.floors == {H100: 64}
    at_128 = window({H100: curve(10, buckets=(128,))})
    assert step(s, after, observe(4 * WINDOW, at_128)).state == after
    between = window({H100: curve(10, buckets=(24, 32, 48))})
    assert step(s, after, observe(4 * WINDOW, between)).state.calibration.trigger == "Traffic"


def test_paying_at_no_measured_batch_lowers_a_start_value_above_them() -> None:
    """The same measurement against a start value of 256 turns speculation off from 64: its
    loss at 128 (speedup 0.47) bounds speedup below 1 down to batch 64."""
    s = spec(value=256, minDwellSeconds=0)
    state = calibrate(s, fresh(s), 0, {H100: curve(10, buckets=(128,))})
    assert state.threshold.current == 64


def test_a_change_that_makes_requests_queue_is_verified_with_a_warning() -> None:
    s = spec()
    calm = dataclasses.replace(
        traffic(), admitted_concurrency=64, e2e_p95_seconds=4.0,
        inter_token_seconds=200.0, inter_tokens=5000,
    )  # fmt: skip
    queued = dataclasses.replace(
        calm, admitted_concurrency=40, e2e_p95_seconds=6.5, inter_token_seconds=120.0
    )
    state = step(s, fresh(s), observe(0, window(load=calm))).state
    state = step(s, state, observe(30, window({H100: curve(12)}, load=calm))).state
    verified = step(s, state, observe(30 + WINDOW, window({H100: curve(12)}, load=queued)))
    assert reasons(verified) == ["SpeculationQueueing", "ThresholdVerified"]
    assert verified.events[0].warning and "making requests queue" in verified.events[0].message
    assert verified.state.threshold.current == 12  # a warning, not a verdict


def measured(s, crossover: float = 12) -> State:
    """Idle after one calibration at T0 whose change was kept."""
    state = calibrate(s, fresh(s), 0, {H100: curve(crossover)})
    return step(s, state, observe(2 * WINDOW, window({H100: curve(crossover)}))).state


def windows(*loads: Traffic, end: float) -> list[tuple[datetime, Traffic]]:
    """Consecutive windows, the last read at T0 + `end` seconds."""
    n = len(loads)
    return [(T0 + timedelta(seconds=end - WINDOW * (n - 1 - i)), t) for i, t in enumerate(loads)]


STEADY = (traffic(),) * 3
POORER = dataclasses.replace(traffic(), accepted_tokens=300.0)  # acceptance 0.6 -> 0.3


@pytest.mark.parametrize(
    ("change", "kind", "words"),
    [
        ({"replicas": 3, "steps": elsewhere()}, "Replicas", "replicas changed from 2 to 3"),
        ({"pods": {"e-0": L4, "e-1": L4}}, "Sku", f"pods run on {L4}, not measured yet"),
        ({"spec": {"numSpeculativeTokens": 6}}, "Spec", "k 4 -> 6"),
        ({"loads": (POORER,) * 3}, "Traffic", "acceptance rate moved by at least -50%"),
        ({"later": 3600}, "MaxAge", "maximum age"),
    ],
)
def test_each_trigger_starts_a_calibration_that_names_it(change, kind, words) -> None:
    s = spec()
    state = measured(s)  # measured at T0 + 60 s under traffic()
    assert state.calibration.baseline is not None
    assert state.calibration.baseline.traffic["requests"] == traffic().requests
    at = 4 * WINDOW + change.get("later", 0)
    quiet = observe(4 * WINDOW, window(), recent=windows(*STEADY, end=4 * WINDOW))
    assert step(s, state, quiet).state == state  # nothing changed: nothing fires
    s2 = spec()
    if "spec" in change:
        s2 = s2.model_copy(update={"speculation": s.speculation.model_copy(update=change["spec"])})
    obs = observe(
        at,
        window(change.get("steps"), change.get("pods")),
        replicas=change.get("replicas", 2),
        recent=windows(*change.get("loads", STEADY), end=4 * WINDOW),
    )
    started = step(s2, state, obs)
    assert started.state.calibration.trigger == kind
    assert reasons(started) == ["CalibrationStarted"] and words in started.events[0].message
    assert autotune.calibrated(s2, started.state)[:2] == (True, "Recalibrating")


def test_a_replica_change_re_measures_only_once_the_load_leaves_the_measured_batches() -> None:
    """An HPA adds a replica as the load rises: each pod runs the batches the last calibration
    measured (1-48 here), the curve there is known, nothing explores. Once most decode steps
    run outside them (a scale-down doubling each pod's batch), it re-measures."""
    s = spec()
    state = measured(s)
    assert state.calibration.baseline is not None
    assert state.calibration.baseline.covered == {H100: [1, 48]}
    inside = observe(4 * WINDOW, window({H100: curve(12, buckets=(8, 12, 16))}), replicas=3)
    assert step(s, state, inside).state == state
    some = {H100: curve(12, buckets=(8, 12, 16, 24)) | elsewhere()[H100]}  # 100 of 900 outside
    assert step(s, state, observe(4 * WINDOW, window(some), replicas=3)).state == state
    outside = step(s, state, observe(4 * WINDOW, window(elsewhere()), replicas=1))
    assert outside.state.calibration.trigger == "Replicas"
    assert outside.events[0].message.endswith(
        f"replicas changed from 2 to 1, and 100% of decode steps on {H100} ran outside "
        "batches 1-48, the range last measured"
    )


def test_a_replica_change_under_a_baseline_without_coverage_re_measures() -> None:
    """Status written before coverage was recorded: any replica change re-measures, as then."""
    s = spec()
    state = measured(s)
    assert state.calibration.baseline is not None
    old = state.calibration.baseline.model_copy(update={"covered": None})
    state = dataclasses.replace(
        state, calibration=state.calibration.model_copy(update={"baseline": old})
    )
    scaled = step(s, state, observe(4 * WINDOW, window(), replicas=3))
    assert scaled.state.calibration.trigger == "Replicas"


def test_traffic_from_before_the_measurement_does_not_count_as_a_shift() -> None:
    s = spec()
    state = measured(s)  # at T0 + 60 s; the goodput check ends at T0 + 120 s
    poorer = (POORER,) * 4
    # windows read at 0, 60, 120, 180 s: only the last two began after the measurement
    assert step(
        s, state, observe(3 * WINDOW, window(), recent=windows(*poorer, end=180))
    ).state == (state)
    shifted = step(s, state, observe(4 * WINDOW, window(), recent=windows(*poorer, end=240)))
    assert shifted.state.calibration.trigger == "Traffic"


def test_poorer_drafting_where_speculation_paid_at_no_batch_re_measures_nothing() -> None:
    """A busy fleet measured speculation paying at no batch from 32 up; acceptance then halves
    (speculation pays even less): the finding holds and nothing explores. Acceptance rising by
    half may make it pay: that re-measures."""
    s = spec(value=None)
    large = window({H100: curve(10, buckets=(32, 48))})
    state = calibrate(s, fresh(s), 0, {H100: curve(10, buckets=(32, 48))})
    state = step(s, state, observe(2 * WINDOW, large)).state
    assert state.calibration.phase == "Idle" and state.calibration.baseline is not None
    assert state.calibration.baseline.outcomes == {H100: "never_pays"}
    poorer = observe(4 * WINDOW, large, recent=windows(*(POORER,) * 3, end=4 * WINDOW))
    assert step(s, state, poorer).state == state
    better = dataclasses.replace(traffic(), accepted_tokens=900.0)  # 0.6 -> 0.9
    started = step(
        s, state, observe(4 * WINDOW, large, recent=windows(*(better,) * 3, end=4 * WINDOW))
    )
    assert started.state.calibration.trigger == "Traffic"
    assert "acceptance rate moved by at least +50%" in started.events[0].message


def test_a_traffic_shift_explores_near_the_thresholds_in_force() -> None:
    """Threshold 12 measured; poorer drafting re-measures speculation past it first in the next
    bucket only (below 16): the lease carries that. Where speculation clearly pays at the
    range's top bucket, the range widens past it, at most to 48 (4 x 12, a bucket's edge), and
    a bucket it reaches waits for its samples; traffic at 96 does not hold the calibration up.
    Other triggers, and a SKU that speculates at every batch, explore every batch."""
    s = spec()
    state = measured(s)
    shifted = observe(4 * WINDOW, window(), recent=windows(*(POORER,) * 3, end=4 * WINDOW))
    exploring = step(s, state, shifted).state
    assert exploring.calibration.trigger == "Traffic"
    assert exploring.calibration.exploreBelow == 16
    start = 4 * WINDOW
    # pays clearly at 12, the top bucket: the range widens to 24, and 16 waits for its samples
    plain_96 = {("plain", 96): ModeStats(400, 400 * 96, 4.0)}
    thin = curve(20, buckets=(8, 12)) | plain_96 | PLAIN_16
    waits = step(s, exploring, observe(start + 20, window({H100: thin})))
    assert reasons(waits) == ["ExplorationWidened"]
    assert waits.events[0].message == (
        "speculation clearly pays below 16: exploring speculation below 24 from now"
    )
    assert waits.state.calibration.phase == "Exploring"
    assert waits.state.calibration.exploreBelow == 24
    # crossing at 14: 0.96 at 16 is no clear loss, and 16 holds its samples: decided
    past = curve(14, buckets=(8, 12, 16)) | plain_96
    done = step(s, waits.state, observe(start + 30, window({H100: past})))
    assert done.state.calibration.phase == "Idle" and reasons(done) == ["ThresholdKept"]
    paying = curve(200, buckets=(8, 12, 16, 24, 32, 48, 64))  # widens at most to 48
    wide = step(s, exploring, observe(start + 20, window({H100: paying})))
    assert wide.state.calibration.exploreBelow == 48
    assert autotune.explore_cap(state, frozenset({H100})) == 48
    aged = step(s, state, observe(4 * WINDOW + 3600, window()))
    assert aged.state.calibration.trigger == "MaxAge"
    assert aged.state.calibration.exploreBelow is None
    reason = autotune.Reason("Traffic", "shift", near=True)
    always = dataclasses.replace(state, threshold=ThresholdStatus(current=None))
    assert autotune.explore_below(always, reason, frozenset({H100})) is None
    assert autotune.explore_below(fresh(s), reason, frozenset()) == 6  # the start value, 4
    assert autotune.explore_below(fresh(s), dataclasses.replace(reason, near=False), {H100}) is None


def test_a_calibration_stops_exploring_speculation_from_a_clear_loss_up() -> None:
    """A first calibration explores every batch; a busy fleet at 32-64 loses clearly at 32
    (speedup 0.61 a mode over 100 steps), which bounds speculation below 1 down to 24: from the
    next turn the lease explores below 24 only, saying so once, while the range settles. It
    never widens, and narrows only once every SKU the window holds loses clearly."""
    s = spec()
    exploring = step(s, fresh(s), observe(0, window())).state
    assert exploring.calibration.exploreBelow is None
    busy = window({H100: curve(6, buckets=(32, 48, 64))})
    narrowed = step(s, exploring, observe(20, busy))
    assert narrowed.state.calibration.phase == "Exploring"
    assert narrowed.state.calibration.exploreBelow == 24
    assert reasons(narrowed) == ["ExplorationNarrowed"]
    assert narrowed.events[0].message == (
        f"speculation clearly loses from batch 24 ({H100}: speedup 0.61 +/- 0.01 at batch 32): "
        "exploring it only below 24 from now"
    )
    lease = tuning.exploration_lease(narrowed.state, T0 + timedelta(seconds=20), 60)
    assert lease is not None and lease["below"] == 24
    again = step(s, narrowed.state, observe(30, busy))
    assert again.events == () and again.state.calibration.exploreBelow == 24
    shift = exploring.calibration.model_copy(update={"exploreBelow": 16})  # a shift's
    kept = step(s, dataclasses.replace(exploring, calibration=shift), observe(20, busy))
    assert kept.events == () and kept.state.calibration.exploreBelow == 16
    pods = {"e-0": H100, "e-1": L4}
    two = window({H100: curve(6, buckets=(32, 48, 64)), L4: curve(96, buckets=(32, 48))}, pods)
    both = step(s, exploring, observe(20, two))
    assert both.events == () and both.state.calibration.exploreBelow is None


def test_a_first_calibration_with_traffic_only_where_speculation_lost_keeps_its_start() -> None:
    """A first calibration narrowed on an early read (its window reaching back before it
    started) to below 24, and its traffic ran only at 32 and up, where its read saw speculation
    clearly lose; its later windows hold no speculation there (it was no longer explored). The
    start value stands, and the baseline records that speculation paid at no batch measured:
    traffic running below 4, the start value, re-measures. (The operator's turn stopped on an
    assertion here: a first calibration has no baseline to keep.)"""
    s = spec()
    exploring = step(s, fresh(s), observe(0, window())).state
    losing = curve(6, buckets=(32, 48, 64))
    narrowed = step(s, exploring, observe(10, window({H100: losing}))).state
    assert narrowed.calibration.exploreBelow == 24
    plain = window({H100: {key: sums for key, sums in losing.items() if key[0] == "plain"}})
    kept = step(s, narrowed, observe(WINDOW, plain, replicas=2))
    assert reasons(kept) == ["ThresholdKept"]
    assert kept.events[0].message == (
        "traffic ran at batch 32 and up, past the batches this calibration explores speculation "
        f"at (below 24): the thresholds in force stand ({H100} 4)"
    )
    state = kept.state
    assert state.calibration.phase == "Idle" and state.threshold.current == 4
    base = state.calibration.baseline
    assert base is not None and base.replicas == 2 and base.skus == [H100]
    assert base.outcomes == {H100: "never_pays"} and base.floors == {H100: 4} and not base.bounds
    assert autotune.trigger(s, state, observe(2 * WINDOW, plain)) is None


def test_traffic_only_past_a_shifts_range_keeps_the_thresholds_and_takes_the_new_traffic() -> None:
    """A busy fleet runs at batch 96 under threshold 12: after poorer drafting there is nothing
    to explore below 16, nor below 48, as far as the range reaches toward the traffic (4 x 12),
    so the calibration ends, keeps 12, and records the new traffic as its baseline: the same
    shift does not start it again. An L4 threshold kept from pods since gone stands too,
    unnamed: it runs nowhere."""
    s = spec()
    state = measured(s)
    gone = SkuThreshold(sku=L4, threshold=3)
    state = dataclasses.replace(state, per_sku=(*state.per_sku, gone))
    recent = windows(*(POORER,) * 3, end=4 * WINDOW)
    exploring = step(s, state, observe(4 * WINDOW, window(), recent=recent)).state
    busy = window(elsewhere(), load=POORER)
    reached = step(s, exploring, observe(4 * WINDOW + 10, busy))
    assert reasons(reached) == ["ExplorationWidened"]  # the load may yet come into range
    assert reached.events[0].message == (
        "traffic ran at batch 96 and up, past the batches explored (below 16): exploring "
        "speculation below 48 from now"
    )
    ended = step(s, reached.state, observe(4 * WINDOW + 30, busy))
    assert reasons(ended) == ["ThresholdKept"]
    assert ended.events[0].message == (
        "traffic ran at batch 96 and up, past the batches this calibration explores speculation "
        f"at (below 48): the thresholds in force stand ({H100} 12)"
    )
    cal = ended.state.calibration
    assert cal.phase == "Idle" and cal.retryAfter is None
    assert ended.state.threshold == state.threshold
    assert thresholds(ended.state) == thresholds(state)  # the L4 just says since when it left
    assert cal.baseline is not None and state.calibration.baseline is not None
    assert cal.baseline.traffic["accepted_tokens"] == POORER.accepted_tokens
    unchanged = ("outcomes", "bounds", "floors", "covered", "replicas", "skus")
    assert {f: getattr(cal.baseline, f) for f in unchanged} == {
        f: getattr(state.calibration.baseline, f) for f in unchanged
    }
    later = 4 * WINDOW + 30 + 4 * WINDOW
    again = observe(later, window(elsewhere()), recent=windows(*(POORER,) * 3, end=later))
    assert step(s, ended.state, again).state == ended.state


def test_damping_holds_a_move_within_the_dwell_time_or_the_dead_band() -> None:
    s = spec()
    state = measured(s)  # changed to 12 at T0 + 30 s; the replica change re-triggers below
    scaled = {"replicas": 3, "before": elsewhere()}
    soon = calibrate(s, state, 3 * WINDOW, {H100: curve(32)}, **scaled)
    assert soon.threshold.current == 12  # 3.5 minutes after the change: the dwell holds it
    assert soon.calibration.phase == "Idle" and soon.crossover.batchSize == 32
    near = calibrate(s, state, 400, {H100: curve(16, steps=20)}, **scaled)
    assert near.threshold.current == 12  # 16 is one bucket up: within the dead band
    # ... unless the bucket it flips gains beyond its noise: bucket 12's 9% over 100 steps a
    # mode is three standard errors (10% a step) from 1; over 20 steps it is not
    clear = calibrate(s, state, 400, {H100: curve(16, steps=100)}, **scaled)
    assert clear.threshold.current == 16
    far = calibrate(s, state, 400, {H100: curve(32)}, **scaled)
    assert far.threshold.current == 32 and far.calibration.phase == "Verifying"

    # a one-bucket move that turns speculation on where it was measured to pay by far is made
    on = spec(value=1)  # batch 1 runs plain
    light = calibrate(on, fresh(on), 0, {H100: curve(100, buckets=(1,))})  # speedup 4 at 1
    assert light.threshold.current == 2 and light.calibration.phase == "Verifying"


def test_a_move_the_dwell_holds_back_is_re_measured_once_the_dwell_has_passed() -> None:
    """A replica change re-measures 3.5 minutes after the last change (the dwell is 5) and
    finds the crossover at 32: the move waits. The last measurement stays the baseline, so the
    replica change still stands against it: nothing starts before the dwell has passed
    (`retryAfter`), then a calibration makes the move. Kept as the baseline, the held
    measurement answered the trigger, and 12 ran against a curve crossing at 32 until some
    other change (in spectune-sim, a threshold of 24 speculated 19 minutes where drafting had
    collapsed and 6 was measured)."""
    s = spec()
    state = measured(s)
    assert state.calibration.changedAt is not None
    due = datetime.fromisoformat(state.calibration.changedAt) + timedelta(minutes=5)
    scaled = {"replicas": 3, "before": elsewhere()}
    held = calibrate(s, state, 3 * WINDOW, {H100: curve(32)}, **scaled)
    assert held.threshold.current == 12 and held.calibration.phase == "Idle"
    assert held.crossover.batchSize == 32  # what it measured, shown
    assert held.calibration.baseline == state.calibration.baseline
    assert held.calibration.retryAfter is not None
    assert datetime.fromisoformat(held.calibration.retryAfter) == due
    early = (due - T0).total_seconds() - 10
    assert step(s, held, observe(early, window(elsewhere()), replicas=3)).state == held
    moved = calibrate(s, held, early + 10, {H100: curve(32)}, **scaled)
    assert moved.threshold.current == 32 and moved.calibration.phase == "Verifying"


def test_the_dead_band_widens_to_the_crossovers_own_error() -> None:
    """A curve that creeps through 1 between batches 24 and 32 (1.005, 0.995) puts the crossover
    at 28, two buckets below the 48 measured before, and neither bucket flipped is clear of 1.
    Measured to 2.3% a mode (a confident estimate), the crossover's error spans two buckets and
    the move is held; measured to 0.2%, it is made."""
    s = spec(minDwellSeconds=0)
    state = measured(s, crossover=48)
    assert state.threshold.current == 48
    speedups = {8: 1.3, 12: 1.2, 16: 1.1, 24: 1.005, 32: 0.995, 48: 0.9, 64: 0.8}
    creeping: StatsByBucket = {}
    for b, speedup in speedups.items():
        creeping[("plain", b)] = ModeStats(100, 100 * b, 1.0)
        creeping[("spec", b)] = ModeStats(100, 200 * b, 2.0 / speedup)
    scaled = {"replicas": 3, "before": elsewhere()}
    noisy = calibrate(s, state, 400, {H100: creeping}, noise=0.023, **scaled)
    assert noisy.threshold.current == 48 and noisy.calibration.phase == "Idle"
    assert noisy.per_sku[0].batchSize == 28 and noisy.per_sku[0].confidencePercent == 51
    quiet = calibrate(s, state, 400, {H100: creeping}, noise=0.002, **scaled)
    assert quiet.threshold.current == 28 and quiet.calibration.phase == "Verifying"


def test_two_skus_get_a_threshold_each() -> None:
    s = spec()
    pods = {"e-0": H100, "e-1": L4, "e-2": L4}
    state = calibrate(s, fresh(s), 0, {H100: curve(12), L4: curve(24)}, pods=pods, replicas=3)
    by_sku = {p.sku: (p.threshold, p.pods) for p in state.per_sku}
    assert by_sku == {H100: (12, 1), L4: (24, 2)}
    assert engine_settings(s, state, H100)[0] == 12
    assert engine_settings(s, state, L4)[0] == 24
    assert state.threshold.current == 24  # the ConfigMap carries the SKU most pods run on
    assert state.crossover.sku == L4


def test_windows_follow_the_phase() -> None:
    s = spec()
    idle = CalibrationStatus()
    assert window_seconds(s, idle, T0) == WINDOW
    exploring = CalibrationStatus(phase="Exploring", startedAt=T0.isoformat())
    assert window_seconds(s, exploring, T0 + timedelta(seconds=45)) == 45
    assert window_seconds(s, exploring, T0 + timedelta(seconds=2)) == autotune.MIN_WINDOW_SECONDS


def test_only_a_change_that_speculates_more_is_rolled_back_on_the_slo_share_alone() -> None:
    """The same windows judge two changes that flip batches 4-7: decode there ran 1.25x
    faster since, and the SLO-met share fell 95% -> 80% with the load. 8 -> 4 turned
    speculation off there, so the share's fall cannot be its doing: kept. 4 -> 8 turned it on,
    and the draft's KV memory can make requests queue: rolled back."""
    before = {("spec", 4): ModeStats(100, 400, 1.0), ("spec", 6): ModeStats(100, 600, 1.5)}
    after = {("plain", 4): ModeStats(100, 400, 0.8), ("plain", 6): ModeStats(100, 600, 1.2)}
    after_window = window({H100: after}, load=traffic(slo_met_share=0.80))
    before_steps = served({H100: before})
    lowered = autotune.verdict(traffic(), before_steps, after_window, {H100: (8, 4)})
    assert lowered.verdict == "keep" and "x1.25 where it flipped" in lowered.message
    raised = autotune.verdict(traffic(), before_steps, after_window, {H100: (4, 8)})
    assert raised.verdict == "roll_back" and "SLO-met share fell" in raised.message


def test_a_range_widens_past_the_buckets_that_clearly_pay_and_stops_where_one_loses() -> None:
    """From a range ending at 12: where speculation pays at every bucket measured it widens
    to its cap (48), or past every bucket measured without one (96); where it crosses at 20, it
    stops at 24, where speculation clearly loses and from which narrowing would explore nothing
    (widening past it would only be narrowed back)."""
    buckets = (8, 12, 16, 24, 32, 48)
    paying = estimate_by_sku({H100: curve(200, buckets=buckets)})
    assert autotune.widened_below(paying, {H100}, 12, 48) == 48
    assert autotune.widened_below(paying, {H100}, 12, None) == 96
    crossing = estimate_by_sku({H100: curve(20, buckets=buckets)})
    assert autotune.narrowed_below(crossing, {H100}, None) == 24
    assert autotune.widened_below(crossing, {H100}, 12, 48) == 24
    assert autotune.widened_below(crossing, {H100}, 24, 48) == 24
    unmeasured = estimate_by_sku({H100: curve(200, buckets=(16, 24))})  # nothing at the top, 8
    assert autotune.widened_below(unmeasured, {H100}, 12, 48) == 12


def test_a_spec_change_re_measures_at_once_while_the_dwell_holds_a_move() -> None:
    """The dwell held a move back (`retryAfter` at its end, an hour away); k then changes from
    4 to 6. The engines run a threshold measured for k = 4: the dwell damps moves, not the
    measurement of a new configuration, so a calibration starts in the next turn (issue 59, C:
    nothing started for the hour)."""
    s = spec(minDwellSeconds=3600)
    state = measured(s)
    scaled = {"replicas": 3, "before": elsewhere()}
    held = calibrate(s, state, 3 * WINDOW, {H100: curve(32)}, **scaled)
    assert held.calibration.retryAfter is not None and held.calibration.failures == 0
    k6 = s.model_copy(
        update={"speculation": s.speculation.model_copy(update={"numSpeculativeTokens": 6})}
    )
    soon = observe(5 * WINDOW, window(elsewhere()), replicas=3)
    assert step(s, held, soon).state == held  # the same configuration waits for the dwell
    started = step(k6, held, soon)
    assert started.state.calibration.trigger == "Spec"
    assert "k 4 -> 6" in started.events[0].message


def test_a_sku_that_leaves_and_comes_back_with_its_threshold_in_status_re_measures_nothing() -> (
    None
):
    """An HPA scales a mixed fleet's only L4 pod away, then back: both SKUs' thresholds stand
    in status, so neither move explores (issue 59, E: each fired the SKU trigger and re-explored
    every batch); a SKU the deployment never ran on does."""
    s = spec()
    pods = {"e-0": H100, "e-1": L4}
    state = step(s, fresh(s), observe(0, window(pods=pods))).state
    both = window({H100: curve(12), L4: curve(32)}, pods=pods)
    state = step(s, state, observe(30, both)).state
    state = step(s, state, observe(30 + WINDOW, both)).state
    assert state.calibration.phase == "Idle" and {p.sku for p in state.per_sku} == {H100, L4}
    away = step(s, state, observe(1000, window(pods={"e-0": H100}), replicas=1)).state
    assert away.calibration == state.calibration and thresholds(away) == thresholds(state)
    back = observe(1600, window(pods=pods), replicas=2)
    assert step(s, away, back).state == state
    a100 = observe(1600, window(pods={"e-0": H100, "e-1": "NVIDIA-A100-SXM4-40GB"}))
    assert step(s, state, a100).state.calibration.trigger == "Sku"


def test_calibrations_that_measure_nothing_back_off_doubling_and_say_why() -> None:
    """Traffic too thin to measure: every calibration fails for want of a bucket in both modes.
    Each retry waits twice as long as the one before, up to the maximum age, and the Calibrated
    condition says why and until when (issue 59, G: Started, Failed every minute, forever, at
    half the iterations explored). A measurement ends the back-off."""
    s = spec(maxAgeSeconds=600)
    state, at, waits = fresh(s), 0.0, []
    thin = window({H100: PLAIN_16})
    for _ in range(5):
        started = step(s, state, observe(at, thin))
        assert reasons(started) == ["CalibrationStarted"]
        early = step(s, started.state, observe(at + WINDOW / 2, thin))
        assert early.state.calibration.phase == "Exploring"
        failed = step(s, early.state, observe(at + WINDOW, thin))
        assert reasons(failed) == ["CalibrationFailed"]
        state = failed.state
        retry = datetime.fromisoformat(state.calibration.retryAfter or "")
        waits.append((retry - (T0 + timedelta(seconds=at + WINDOW))).total_seconds())
        at = (retry - T0).total_seconds()
        before = observe(at - 1, thin)
        assert step(s, state, before).state == state  # nothing before the retry is due
    assert waits == [60, 120, 240, 480, 600]
    ok, reason, message = autotune.calibrated(s, state)
    assert (ok, reason) == (False, "CalibrationFailing")
    assert message.startswith("5 calibrations in a row measured nothing (no SKU has a batch")
    assert state.calibration.retryAfter in message
    kept = calibrate(s, state, at, {H100: curve(12)})
    assert kept.calibration.failures == 0 and kept.calibration.baseline is not None


def test_a_threshold_of_1_that_a_one_sided_loss_agrees_with_is_re_measured_below() -> None:
    """A threshold of 1 (never speculate) from an earlier, noisy calibration; the next one
    measures only batches 24 and up, where speculation does not pay ("off from 24 up, smaller
    batches not measured"). 1 agrees with that and stands, but no standing measurement reaches
    below 24: once traffic runs there, the floor trigger measures it, and 1 is left where
    speculation pays (issue 59, O: the A100 of the three-SKU e2e never speculated at 1-16)."""
    s = spec()
    state = calibrate(s, fresh(s), 0, {H100: curve(0.5)})  # loses everywhere: off from 1
    state = step(s, state, observe(2 * WINDOW, window({H100: curve(0.5)}))).state
    assert state.threshold.current == 1 and state.calibration.phase == "Idle"
    busy = curve(20, buckets=(24, 32, 48))  # 0.95 at 24, 0.9 at 48: off from 24 up
    aged = calibrate(s, state, 4000, {H100: busy})
    assert aged.calibration.trigger == "MaxAge" and aged.threshold.current == 1  # agrees
    assert aged.per_sku[0].reason.endswith("off from 24 up, smaller batches not measured")
    assert aged.calibration.baseline is not None
    assert aged.calibration.baseline.floors == {H100: 24}
    low = {H100: {("plain", 8): ModeStats(200, 1600, 1.0), **busy}}
    started = step(s, aged, observe(4000 + 2 * WINDOW, window(low)))
    assert started.state.calibration.trigger == "Traffic"
    assert started.state.calibration.exploreBelow == 24
    paying = {H100: curve(20, buckets=(4, 8, 12, 16, 24))}
    left = calibrate(s, aged, 4000 + 2 * WINDOW, paying, before=low)
    assert left.threshold.current == 21 and left.calibration.phase == "Verifying"


def test_a_sku_gone_for_longer_than_the_maximum_age_leaves_status() -> None:
    """Issue 59, J: status kept every SKU the deployment ever ran on. A SKU no pod runs on for
    longer than tuning.maxAgeSeconds goes; until then it keeps its threshold for pods that come
    back (and says since when it is gone)."""
    s = spec()
    pods = {"e-0": H100, "e-1": L4}
    state = step(s, fresh(s), observe(0, window(pods=pods))).state
    both = window({H100: curve(12), L4: curve(32)}, pods=pods)
    state = step(s, state, observe(30, both)).state
    state = step(s, state, observe(30 + WINDOW, both)).state
    h100_only = window(pods={"e-0": H100})
    left = step(s, state, observe(1800, h100_only, replicas=1)).state
    gone = {p.sku: p.goneSince for p in left.per_sku}
    assert gone == {H100: None, L4: (T0 + timedelta(seconds=1800)).isoformat()}
    back = step(s, left, observe(1900, window(pods=pods))).state
    assert back.per_sku == state.per_sku  # back: nothing changed, nothing to write
    left = step(s, back, observe(2000, h100_only, replicas=1)).state
    still = step(s, left, observe(2000 + 3500, h100_only, replicas=1)).state
    assert {p.sku for p in still.per_sku} == {H100, L4}
    pruned = step(s, left, observe(2000 + 3600, h100_only, replicas=1)).state
    assert {p.sku for p in pruned.per_sku} == {H100}
