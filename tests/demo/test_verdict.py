"""The verdict reads the timeline right: each threshold change is tied to the calibration that
started it (and only that one), the goodput checks cover exactly the phases where the
threshold matters, and the verdict fails when the demo did not show enough."""

from __future__ import annotations

import math

import pytest

from spectune.demo.timeline import CHANGED, TRIGGERED, Timeline
from spectune.demo.verdict import Change, goodput_checks, threshold_changes, verdict

from .support import MARKS, counterfactual, mark, timeline


def _with_marks(*marks) -> Timeline:
    return timeline().model_copy(update={"marks": list(marks)})


def test_each_change_carries_the_trigger_that_started_its_calibration() -> None:
    triggers = [m for _, _, r, m in MARKS if r == TRIGGERED]
    changes = threshold_changes(timeline())
    assert changes == [
        Change(65, "quiet", MARKS[1][3], triggers[0]),
        Change(185, "busy", MARKS[3][3], triggers[1]),
        Change(365, "moved", MARKS[7][3], triggers[3]),
    ]


def test_a_change_without_a_calibration_is_unexplained() -> None:
    changes = threshold_changes(_with_marks(mark(10, CHANGED, "moved by hand")))
    assert changes == [Change(10, "busy", "moved by hand", None)]


def test_a_trigger_before_an_earlier_change_does_not_explain_a_later_one() -> None:
    changes = threshold_changes(
        _with_marks(mark(10, TRIGGERED, "replicas"), mark(50, CHANGED), mark(100, CHANGED))
    )
    assert [c.trigger for c in changes] == ["replicas", None]


def test_a_trigger_used_up_by_a_kept_threshold_explains_no_later_change() -> None:
    marks = [mark(10, TRIGGERED, "traffic"), mark(50, "ThresholdKept"), mark(100, CHANGED)]
    assert [c.trigger for c in threshold_changes(_with_marks(*marks))] == [None]


def test_one_decision_changing_two_skus_shares_its_trigger() -> None:
    marks = [mark(10, TRIGGERED, "skus"), mark(50, CHANGED, "A100"), mark(50.4, CHANGED, "H100")]
    assert [c.trigger for c in threshold_changes(_with_marks(*marks))] == ["skus", "skus"]


def test_the_latest_trigger_explains_and_marks_are_read_in_time_order() -> None:
    marks = [mark(100, CHANGED), mark(40, TRIGGERED, "second"), mark(10, TRIGGERED, "first")]
    assert [c.trigger for c in threshold_changes(_with_marks(*marks))] == ["second"]


def test_goodput_is_checked_only_where_the_batch_reaches_the_crossover() -> None:
    """In the modelled GPU's throughput, not the wall clock this CPU may have stretched."""
    checks = goodput_checks(timeline(), tolerance=0.03)
    assert [(c.phase, c.better, c.passed) for c in checks] == [
        ("busy", "never", True),
        ("moved", "never", True),
    ]
    assert checks[0].ratio == pytest.approx(3.1 / 3.04)
    assert checks[1].ratio == pytest.approx(4.2 / 4.25)
    assert goodput_checks(timeline(), tolerance=0.01)[1].passed is False  # 0.988 < 0.99


def _one_phase(auto: float, never: float, always: float, **phase) -> Timeline:
    t = timeline()
    busy = t.phases[1]
    c = counterfactual(34, auto, never, always)
    return t.model_copy(update={"phases": [busy.model_copy(update={"counterfactual": c, **phase})]})


def test_a_phase_below_the_crossover_or_without_one_is_not_checked() -> None:
    assert goodput_checks(_one_phase(1, 2, 2, peak_batch=20.0), 0.03) == []
    unmeasured = _one_phase(1, 2, 2, crossover=None, threshold=96)  # the batch stays below it
    assert goodput_checks(unmeasured, 0.03) == []


def test_a_bound_checks_the_phase_where_the_batch_reaches_the_threshold() -> None:
    """'does not pay even at 32': speculation off from 32 up, and the batch went past it."""
    (check,) = goodput_checks(_one_phase(1, 2, 2, crossover=None, threshold=32), 0.03)
    assert (check.phase, check.passed) == ("busy", False)
    assert goodput_checks(_one_phase(1, 2, 2, crossover=None, threshold=1), 0.03) == []  # never
    t = timeline()
    no_counterfactual = [p.model_copy(update={"counterfactual": None}) for p in t.phases]
    assert goodput_checks(t.model_copy(update={"phases": no_counterfactual}), 0.03) == []


def test_the_tolerance_is_inclusive() -> None:
    (edge,) = goodput_checks(_one_phase(3.0, 4.0, 1.0), tolerance=0.25)  # exactly 0.75
    (below,) = goodput_checks(_one_phase(2.99, 4.0, 1.0), tolerance=0.25)
    (always,) = goodput_checks(_one_phase(3.0, 1.0, 4.0), tolerance=0.25)
    assert (edge.ratio, edge.passed, below.passed) == (0.75, True, False)
    assert always.better == "always"


def test_zero_goodput_from_both_fixed_policies_divides_safely() -> None:
    (both_zero,) = goodput_checks(_one_phase(0.0, 0.0, 0.0), 0.03)
    (only_auto,) = goodput_checks(_one_phase(0.5, 0.0, 0.0), 0.03)
    assert (both_zero.ratio, both_zero.passed) == (1.0, True)
    assert math.isinf(only_auto.ratio) and only_auto.passed


def test_the_demo_timeline_passes_and_says_why() -> None:
    v = verdict(timeline())
    assert v.ok and v.unexplained == 0 and len(v.changes) == 3
    assert v.lines() == [
        "3 threshold changes, each after a calibration its trigger started",
        "phase busy: auto 1.02x the better fixed policy (never) in decode throughput at its "
        "batches — passes",
        "phase moved: auto 0.99x the better fixed policy (never) in decode throughput at its "
        "batches — passes",
        "verdict: passed",
    ]


def test_fewer_changes_than_expected_fail() -> None:
    v = verdict(timeline(), min_changes=4)
    assert not v.ok
    assert "fewer threshold changes than the 4 the demo expects" in v.lines()
    assert v.lines()[-1] == "verdict: FAILED"


def test_an_unexplained_change_or_a_lost_check_fails() -> None:
    t = timeline()
    extra = t.model_copy(update={"marks": [*t.marks, mark(420, CHANGED, "by hand", "moved")]})
    v = verdict(extra)
    assert not v.ok and v.unexplained == 1 and len(v.changes) == 4
    assert v.lines()[:2] == [
        "4 threshold changes, 1 with no calibration that started it:",
        "  7:00 moved: by hand",
    ]
    lost = verdict(_one_phase(2.0, 3.0, 1.0))
    assert not verdict(t, tolerance=0.01).ok
    assert any(line.endswith("fails (below 0.97x)") for line in lost.lines())
