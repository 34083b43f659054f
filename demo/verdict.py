"""Whether the demo showed what it claims, read from the timeline alone: the operator moved the
threshold several times, each move came out of a calibration that a named trigger started, and
where the threshold matters (the batch reaches the crossover) the chosen threshold serves at
least as much as the better fixed policy (in decode throughput at the phase's batches:
demo/counterfactual.py). Pure functions, so they are tested without a cluster."""

from __future__ import annotations

import math
from dataclasses import dataclass

from spectune.demo.timeline import CHANGED, TRIGGERED, Counterfactual, Mark, Timeline
from spectune.demo.view import clock

# The Events of one decision: a calibration ends in one of these per SKU, all in one reconcile.
DECIDED = (CHANGED, "ThresholdKept", "ThresholdRecommended")
# Marks of one decision this close together are one reconcile read at slightly different times.
SAME_DECISION_S = 1.0


@dataclass(frozen=True)
class Change:
    """A ThresholdChanged mark and the CalibrationStarted message that explains it (None: no
    calibration started it, so the demo cannot say why the threshold moved)."""

    t: float
    phase: str
    message: str
    trigger: str | None


@dataclass(frozen=True)
class GoodputCheck:
    """A phase where the threshold matters: the operator's threshold against the better of
    the two fixed policies on the same traffic (the phase's counterfactual), in decode
    throughput at the phase's batches on the GPU's clock."""

    phase: str
    ratio: float
    passed: bool
    better: str  # the better fixed policy: "never" or "always"


def threshold_changes(timeline: Timeline) -> list[Change]:
    """Every threshold change with its trigger: the latest CalibrationStarted before it that no
    earlier decision used up. A decision (one reconcile's ThresholdChanged/Kept per SKU, marks
    within SAME_DECISION_S of each other) shares one trigger, so a second SKU's change is not
    'unexplained'; the next decision needs a calibration of its own."""
    changes: list[Change] = []
    trigger: str | None = None
    decided_at: float | None = None  # when the decision that used `trigger` began
    for mark in _in_order(timeline.marks):
        if decided_at is not None and mark.t - decided_at > SAME_DECISION_S:
            trigger, decided_at = None, None
        if mark.reason == TRIGGERED:
            trigger, decided_at = mark.message, None
        elif mark.reason in DECIDED:
            if decided_at is None:
                decided_at = mark.t
            if mark.reason == CHANGED:
                changes.append(Change(mark.t, mark.phase, mark.message, trigger))
    return changes


def _in_order(marks: list[Mark]) -> list[Mark]:
    """By time; ties keep the driver's order (it reads Events in the order they were made)."""
    return sorted(marks, key=lambda m: m.t)


def goodput_checks(timeline: Timeline, tolerance: float) -> list[GoodputCheck]:
    """One check per phase whose batch reaches the crossover and that has a counterfactual:
    below the crossover every threshold above the batch behaves alike, so only these phases
    can show the threshold was chosen well."""
    checks = []
    for phase in timeline.phases:
        c = phase.counterfactual
        if c is None or not phase.crosses:
            continue
        ratio, better = against_better_fixed(c)
        checks.append(GoodputCheck(phase.name, ratio, ratio >= 1 - tolerance, better))
    return checks


def against_better_fixed(c: Counterfactual) -> tuple[float, str]:
    """(auto ÷ the better fixed policy, which policy that is), in decode throughput at the
    phase's batches. Both fixed at 0: 1.0 when auto is 0 too (all alike), else inf (only auto
    served anything)."""
    auto, never, always = (c.gpu_tokens_per_s[k] for k in ("auto", "never", "always"))
    best = max(never, always)
    better = "never" if never >= always else "always"
    if best > 0:
        return auto / best, better
    return (1.0 if auto == 0 else math.inf), better


@dataclass(frozen=True)
class Verdict:
    """The demo's claim, checked: enough changes, each explained, and no crossing phase where
    the operator's threshold lost goodput beyond `tolerance` to a fixed policy."""

    changes: tuple[Change, ...]
    unexplained: int
    checks: tuple[GoodputCheck, ...]
    min_changes: int
    tolerance: float

    @property
    def ok(self) -> bool:
        return (
            len(self.changes) >= self.min_changes
            and self.unexplained == 0
            and all(c.passed for c in self.checks)
        )

    def lines(self) -> list[str]:
        """What a person reads at the end of the demo and in the report, one claim a line."""
        n = len(self.changes)
        noun = "threshold change" if n == 1 else "threshold changes"
        if self.unexplained == 0:
            each = "each after a calibration its trigger started" if n else "none to explain"
            lines = [f"{n} {noun}, {each}"]
        else:
            lines = [f"{n} {noun}, {self.unexplained} with no calibration that started it:"]
            lines += [
                f"  {clock(c.t)} {c.phase}: {c.message}" for c in self.changes if c.trigger is None
            ]
        if n < self.min_changes:
            lines.append(f"fewer threshold changes than the {self.min_changes} the demo expects")
        for check in self.checks:
            verdict = "passes" if check.passed else f"fails (below {1 - self.tolerance:.2f}x)"
            lines.append(
                f"phase {check.phase}: auto {check.ratio:.2f}x the better fixed policy "
                f"({check.better}) in decode throughput at its batches — {verdict}"
            )
        if not self.checks:
            lines.append(
                "no phase reached the crossover with a counterfactual: throughput unchecked"
            )
        lines.append("verdict: " + ("passed" if self.ok else "FAILED"))
        return lines


def verdict(timeline: Timeline, min_changes: int = 3, tolerance: float = 0.03) -> Verdict:
    """The demo's verdict; `tolerance` is the goodput the operator may lose to noise."""
    changes = threshold_changes(timeline)
    return Verdict(
        changes=tuple(changes),
        unexplained=sum(c.trigger is None for c in changes),
        checks=tuple(goodput_checks(timeline, tolerance)),
        min_changes=min_changes,
        tolerance=tolerance,
    )
