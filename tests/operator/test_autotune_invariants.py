"""The state machine keeps its invariants where a review found them broken (issue 31): no
change kept without a verdict that it did not hurt, no per-SKU threshold lost, no curve of
one configuration recorded as another's, Manual pinned on every engine, a rollback restoring
where the threshold came from, and no exception on a window of zeros."""

from __future__ import annotations

from datetime import timedelta

from spectune.engine.crossover import ModeStats
from spectune.operator import autotune
from spectune.operator.autotune import State, engine_settings, step, window_seconds
from spectune.operator.models import CalibrationStatus, SkuThreshold, ThresholdStatus
from spectune.operator.observations import served
from spectune.operator.status import threshold_status
from spectune.operator.verification import same_mix_speedup

from .machine import (
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


def reasons(result: autotune.Step) -> list[str]:
    return [e.reason for e in result.events]


def verifying(s, start: float = 0, crossover: float = 12, **kw) -> State:
    """A calibration started at T0 + `start` that moved the threshold at `start` + 30 s."""
    state = step(s, fresh(s), observe(start, window(), **kw)).state
    moved = step(s, state, observe(start + 30, window({H100: curve(crossover)}), **kw)).state
    assert moved.calibration.phase == "Verifying", moved
    return moved


# 3. A change is kept only after a verdict that says it did not hurt.


def test_a_read_error_while_verifying_waits_then_rolls_back_never_keeps() -> None:
    s = spec()
    state = verifying(s)
    assert state.threshold.current == 12
    gone = step(s, state, observe(30 + WINDOW, None, error="connection refused"))
    assert gone.state.calibration.phase == "Verifying"  # no verdict yet: wait for Prometheus
    assert engine_settings(s, gone.state, H100) == (12, 2)
    late = observe(30 + autotune.VERIFY_WINDOWS * WINDOW, None, error="connection refused")
    rolled = step(s, gone.state, late)
    assert reasons(rolled) == ["RolledBack"] and rolled.events[0].warning
    assert "not verified" in rolled.events[0].message and "connection refused" in (
        rolled.events[0].message
    )
    assert rolled.state.threshold.current == 4 and rolled.state.calibration.phase == "Idle"


def test_a_read_error_while_verifying_then_prometheus_back_verifies() -> None:
    s = spec()
    state = verifying(s)
    gone = step(s, state, observe(30 + WINDOW, None, error="connection refused")).state
    back = step(s, gone, observe(40 + WINDOW, window({H100: curve(12)})))
    assert reasons(back) == ["ThresholdVerified"] and back.state.threshold.current == 12


def test_no_comparable_traffic_extends_verification_once_then_rolls_back() -> None:
    s = spec()
    state = verifying(s)
    busier = window(load=traffic(rate=30.0))  # no decode steps to compare, load tripled
    extended = step(s, state, observe(30 + WINDOW, busier))
    assert reasons(extended) == ["VerificationExtended"]
    assert "not comparable" in extended.events[0].message
    assert extended.state.calibration.phase == "Verifying"
    again = step(s, extended.state, observe(40 + WINDOW, busier))
    assert again.events == () and again.state.calibration.phase == "Verifying"  # one Event
    late = observe(30 + autotune.VERIFY_WINDOWS * WINDOW, busier)
    rolled = step(s, again.state, late)
    assert reasons(rolled) == ["RolledBack"] and "not verified" in rolled.events[0].message
    assert rolled.state.threshold.current == 4


def test_no_traffic_recorded_before_the_change_rolls_back() -> None:
    s = spec()
    state = verifying(s)
    blind = state.calibration.model_copy(update={"before": {}})
    state = State(state.threshold, state.crossover, state.per_sku, blind)
    late = observe(30 + autotune.VERIFY_WINDOWS * WINDOW, window({H100: curve(12)}))
    rolled = step(s, state, late)
    assert reasons(rolled)[-1] == "RolledBack" and rolled.state.threshold.current == 4


# 4. A calibration that sees one SKU keeps the others' thresholds.


def two_skus_measured(s) -> State:
    """Idle after a verified calibration that measured an H100 (12) and an L4 (32)."""
    pods = {"e-0": H100, "e-1": L4}
    state = step(s, fresh(s), observe(0, window(pods=pods))).state
    both = window({H100: curve(12), L4: curve(32)}, pods=pods)
    state = step(s, state, observe(30, both)).state
    state = step(s, state, observe(30 + WINDOW, both)).state
    assert {p.sku: p.threshold for p in state.per_sku} == {H100: 12, L4: 32}
    return state


def test_a_calibration_that_sees_one_sku_keeps_the_others_threshold() -> None:
    s = spec()
    state = two_skus_measured(s)
    h100_only = {"e-0": H100}  # the L4 pod unscraped this time (or scaled away and back)
    later = 3700  # past the maximum age: a SKU that leaves starts nothing by itself
    again = step(s, state, observe(later, window(pods=h100_only), replicas=1)).state
    again = step(s, again, observe(later + 30, window({H100: curve(48)}, h100_only), 1)).state
    assert {p.sku: p.threshold for p in again.per_sku} == {H100: 48, L4: 32}
    assert engine_settings(s, again, L4)[0] == 32
    # the ConfigMap (which every engine reloads) carries the SKU the pods run on now, not the
    # one a pod ran on when it was measured (a tie in pods once went to the larger name)
    assert {p.sku: p.pods for p in again.per_sku} == {H100: 1, L4: 0}
    assert again.threshold.current == 48


# 5. A spec change mid-calibration never ends in a baseline recording the new spec.


def test_a_spec_change_while_exploring_restarts_the_calibration() -> None:
    s = spec()
    exploring = step(s, fresh(s), observe(0, window())).state
    k6 = s.model_copy(
        update={"speculation": s.speculation.model_copy(update={"numSpeculativeTokens": 6})}
    )
    changed = step(k6, exploring, observe(30, window({H100: curve(12)})))
    assert reasons(changed) == ["CalibrationRestarted"] and "k 4 -> 6" in changed.events[0].message
    assert changed.state.calibration.phase == "Idle"
    assert changed.state.threshold.current == 4 and changed.state.calibration.retryAfter is None
    restarted = step(k6, changed.state, observe(40, window()))
    assert reasons(restarted) == ["CalibrationStarted"]


def test_a_spec_change_while_verifying_rolls_back_and_re_measures() -> None:
    s = spec()
    state = verifying(s)
    k6 = s.model_copy(
        update={"speculation": s.speculation.model_copy(update={"numSpeculativeTokens": 6})}
    )
    changed = step(k6, state, observe(40, window({H100: curve(12)})))
    assert reasons(changed) == ["RolledBack"] and "k 4 -> 6" in changed.events[0].message
    assert changed.state.threshold.current == 4 and changed.state.calibration.phase == "Idle"
    baseline = changed.state.calibration.baseline
    assert baseline is not None and baseline.k == 4  # the curve was measured with k 4
    later = step(k6, changed.state, observe(40 + WINDOW, window()))
    assert later.state.calibration.trigger == "Spec"


# 6. Manual is what every engine runs; Manual -> Auto re-measures.


def test_manual_pins_every_engine_whatever_was_measured_per_sku() -> None:
    auto = spec()
    pods = {"e-0": H100, "e-1": L4}
    state = two_skus_measured(auto)
    manual = spec("Manual", 6)
    pinned = step(manual, State(ThresholdStatus(current=6, source="Spec"), state.crossover,
                                state.per_sku, state.calibration), observe(200, None))  # fmt: skip
    for sku in (H100, L4, None):
        assert engine_settings(manual, pinned.state, sku) == (6, 2)
    back = State(ThresholdStatus(current=6, source="Spec"), pinned.state.crossover,
                 pinned.state.per_sku, pinned.state.calibration)  # fmt: skip
    again = step(auto, back, observe(210, window(pods=pods)))
    assert reasons(again) == ["CalibrationStarted"]
    assert again.state.calibration.trigger == "Initial"


# 7. A rollback restores where the threshold came from.


def test_a_rollback_to_the_spec_value_gives_the_spec_its_value_back() -> None:
    s = spec()
    state = verifying(s)
    assert state.threshold.source == "Measured"
    worse = window({H100: curve(12)}, load=traffic(slo_met_share=0.7))
    rolled = step(s, state, observe(30 + WINDOW, worse)).state
    assert rolled.threshold == ThresholdStatus(current=4, recommended=12, source="Spec")
    edited = spec(value=6)
    state = State(threshold_status(edited, rolled.threshold), rolled.crossover, rolled.per_sku,
                  rolled.calibration)  # fmt: skip
    assert engine_settings(edited, state, H100) == (6, 2)


# 8. A window of zeros is no exception.


def test_a_bucket_with_no_tokens_before_is_skipped_not_divided_by() -> None:
    before = {H100: {8: ModeStats(100, 0, 1.0), 16: ModeStats(100, 1600, 1.0)}}
    after = {H100: {8: ModeStats(100, 800, 1.0), 16: ModeStats(100, 1600, 1.0)}}
    mix = same_mix_speedup(before, after, lambda sku, bucket: True)
    assert mix is not None and mix.speedup == 1.0 and mix.covered == 0.5


def test_a_verification_on_a_window_of_zeros_does_not_raise() -> None:
    s = spec()
    zeros = {H100: {("plain", b): ModeStats(100, 0, 1.0) for b in (1, 2, 4, 8)}}
    state = step(s, fresh(s), observe(0, window(zeros))).state
    state = step(s, state, observe(30, window({H100: curve(12)}))).state
    verdict = step(s, state, observe(30 + WINDOW, window(zeros)))
    assert verdict.state.calibration.phase in ("Verifying", "Idle")
    assert served(zeros)[H100][8].steps == 100


# 9. The "before" window holds neither the last exploration nor the last change.


def test_the_before_window_starts_after_the_last_calibration_ended() -> None:
    s = spec()
    state = verifying(s)
    kept = step(s, state, observe(30 + WINDOW, window({H100: curve(12)}))).state
    ended = T0 + timedelta(seconds=30 + WINDOW)
    assert kept.calibration.phase == "Idle"
    assert window_seconds(s, kept.calibration, ended + timedelta(seconds=25)) == 25
    assert window_seconds(s, kept.calibration, ended + timedelta(seconds=500)) == WINDOW
    on_l4 = {"e-0": L4, "e-1": L4}
    soon = observe(30 + WINDOW + 5, window(pods=on_l4))
    # 5 s of calm: too short a "before" to start (the H100 only notes that it is gone)
    assert step(s, kept, soon).state.calibration == kept.calibration
    later = step(s, kept, observe(30 + WINDOW + 15, window(pods=on_l4)))
    assert later.state.calibration.trigger == "Sku"


def test_a_rollback_keeps_its_own_per_sku_thresholds_measured() -> None:
    s = spec()
    state = verifying(s, crossover=12)
    kept = step(s, state, observe(30 + WINDOW, window({H100: curve(12)}))).state
    assert kept.threshold.source == "Measured"
    moved = step(s, kept, observe(1000, window(elsewhere()), replicas=3)).state
    moved = step(s, moved, observe(1030, window({H100: curve(48)}), replicas=3)).state
    assert moved.threshold.current == 48
    worse = window({H100: curve(12)}, load=traffic(slo_met_share=0.7))
    rolled = step(s, moved, observe(1030 + WINDOW, worse, replicas=3)).state
    assert rolled.threshold.current == 12 and rolled.threshold.source == "Measured"
    assert rolled.per_sku[0] == SkuThreshold(**{**rolled.per_sku[0].model_dump(), "threshold": 12})


def test_a_measured_threshold_outside_a_narrowed_range_moves_into_it() -> None:
    """A one-sided measurement that agrees with the threshold keeps it, unless the spec's
    range no longer holds it: threshold.max lowered below it moves it to the new max."""
    s = spec()
    pays = {H100: curve(100, buckets=(1, 2, 4, 8))}  # pays everywhere: asks for 12
    state = step(s, fresh(s), observe(0, window())).state
    state = step(s, state, observe(WINDOW, window(pays))).state  # a bound: the window's end
    state = step(s, state, observe(2 * WINDOW, window(pays))).state
    assert state.threshold.current == 12 and state.calibration.phase == "Idle"
    t = s.speculation.threshold.model_copy(update={"max": 4})
    narrow = s.model_copy(update={"speculation": s.speculation.model_copy(update={"threshold": t})})
    again = step(narrow, state, observe(1000, window(elsewhere()), replicas=3)).state
    moved = step(narrow, again, observe(1000 + WINDOW, window(pays), replicas=3))
    assert moved.state.threshold.current == 4, moved.events


# The "before" window a change is verified against holds a load the engines were serving.


def test_no_calibration_starts_until_the_last_ready_pod_served_half_a_window() -> None:
    s = spec()
    ready = T0 + timedelta(seconds=100)
    early = step(s, fresh(s), observe(100 + WINDOW / 2 - 1, window(), ready_at=ready))
    assert early.state.calibration.phase == "Idle" and early.events == ()
    started = step(s, fresh(s), observe(100 + WINDOW / 2, window(), ready_at=ready))
    assert reasons(started) == ["CalibrationStarted"]
    cal = started.state.calibration
    # the window it read (and keeps as "before") starts where the last pod became ready
    assert window_seconds(s, cal.model_copy(update={"phase": "Idle"}), T0 + timedelta(
        seconds=100 + WINDOW / 2), ready) == WINDOW / 2  # fmt: skip


# 11. The minimum window follows the scrape interval observed.


def test_the_shortest_window_is_two_scrapes() -> None:
    s = spec()
    exploring = CalibrationStatus(phase="Exploring", startedAt=T0.isoformat())
    two_seconds_in = T0 + timedelta(seconds=2)
    assert window_seconds(s, exploring, two_seconds_in) == autotune.MIN_WINDOW_SECONDS
    assert window_seconds(s, exploring, two_seconds_in, interval=30.0) == 60
    # a calibration 45 s in at a 30 s interval has not yet two scrapes: it decides nothing and
    # goes on exploring, though no longer where speculation already loses clearly
    long = spec(calibrationWindowSeconds=240)  # 8 scrapes at 30 s
    state = step(long, fresh(long), observe(0, window(interval=30.0))).state
    early = step(long, state, observe(45, window({H100: curve(12)}, interval=30.0)))
    assert early.state.calibration.phase == "Exploring"
    assert [e.reason for e in early.events] == ["ExplorationNarrowed"]
    assert early.state.threshold == state.threshold
