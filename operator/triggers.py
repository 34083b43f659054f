"""When to re-measure the crossover: pure change detection (DESIGN.md, "Re-measuring the
crossover on live traffic"). How far to move the threshold is damping.py's; whether a move
hurt, verification.py's.

Each trigger compares what the last calibration saw with what is true now and returns a
`Reason` a human can read (it goes into Events and status) or None. Unknown inputs (None, an
empty SKU set while pods start) never fire a trigger: missing data is not a change. `now` is
always a parameter, so every decision here is reproducible in a test.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Literal

from spectune.engine.crossover import StatsByBucket
from spectune.operator.damping import duration_text
from spectune.operator.estimator import MIN_STEPS, RARE_SHARE
from spectune.operator.models import Outcome, SpecDeploymentSpec
from spectune.operator.observations import Traffic
from spectune.operator.verification import slo_share_drop

# Initial: nothing measured yet (a new SpecDeployment, or Manual switched to Auto).
TriggerKind = Literal["Initial", "Replicas", "Sku", "Traffic", "MaxAge", "Spec"]


@dataclass(frozen=True)
class Reason:
    """Why a calibration starts: `kind` labels metrics, `message` is for people. `near`: the
    change moves the crossover by a bounded factor (a traffic shift), so a calibration explores
    near the thresholds measured last rather than at every batch."""

    kind: TriggerKind
    message: str
    near: bool = False
    below: int | None = None  # explore speculation past the threshold only below this batch


# The traffic signals a shift is judged on, and which way each moves speculation's speedup at
# every batch as it rises: +1 up, 0 either way, None not at all.
# - The request rate per engine moves only the batches each pod runs: it re-measures nothing
#   alone (named beside a signal that does). Where the load's batches go is past_bound's and
#   below_floor's to judge, and a measured crossing holds at every batch: speedup falls as the
#   batch grows. Re-measured, a fleet at batch 128 on a curve measured not paying from 12 up
#   explored 50% for nothing (its window at 0.824x `never`'s goodput; spectune-sim, an HPA hour).
# - Longer prompts add KV reads (which favour speculation) and draft prefill (which does not).
# - Longer outputs spread the draft's prefill over more tokens and lengthen contexts; a higher
#   acceptance rate commits more tokens per verify: both favour speculation.
TRAFFIC_SIGNALS: dict[str, tuple[str, int | None]] = {
    "request rate per engine": ("request_rate_per_engine", None),
    "prompt tokens per request": ("prompt_tokens_per_request", 0),
    "output tokens per request": ("tokens_per_request", 1),
    "acceptance rate": ("acceptance", 1),
}
# A shift that moves speedup this way leaves a measurement that found this everywhere true.
STILL_TRUE: dict[int, Outcome] = {1: "always_pays", -1: "never_pays"}


def replicas_changed(
    before: int,
    now: int,
    covered: Mapping[str, Sequence[int]] | None = None,
    steps: Mapping[str, StatsByBucket] | None = None,
    share: float = 0.5,
    min_steps: int = MIN_STEPS,
) -> Reason | None:
    """A replica change moves the batches each pod runs, not the speedup curve (on hardware a
    pod has to itself): it re-measures only once most of a window's decode steps on a SKU
    run outside the buckets the last calibration `covered` (SKU -> smallest, largest bucket
    measured in both modes). An HPA that keeps each pod's load where it was then never starts
    one; the window, a majority of steps after the change, is its debounce. None for
    `covered` (a baseline from before coverage was recorded) re-measures on any change."""
    if before == now:
        return None
    changed = f"replicas changed from {before} to {now}"
    if covered is None:
        return Reason("Replicas", changed)
    for sku, (low, high) in sorted(covered.items()):
        outside = _share_of_steps(
            (steps or {}).get(sku, {}), lambda b, lo=low, hi=high: not lo <= b <= hi, share,
            min_steps,
        )  # fmt: skip
        if outside is not None:
            measured = f"batch {low}" if low == high else f"batches {low}-{high}"
            return Reason(
                "Replicas",
                f"{changed}, and {outside:.0%} of decode steps on {sku} ran outside {measured}, "
                "the range last measured",
            )
    return None


def skus_unmeasured(
    measured: Mapping[str, datetime],
    now: frozenset[str],
    at: datetime,
    max_age: timedelta | None,
) -> Reason | None:
    """GPU SKUs that pods run on with no measurement of their own (node labels or the engines'
    `device` label): new to the deployment, or last measured `max_age` ago or longer (None: not
    asked; the MaxAge trigger re-measures the whole fleet). A SKU that left and came back with
    its measurement still in status (an HPA scaling the only L4 pod away and back) runs its own
    threshold again and re-measures nothing, nor does a SKU that left. An empty set is unknown
    (no pod placed or scraped yet), not a change; so is a deployment nothing was measured on
    yet (the Initial trigger's)."""
    if not measured or not now:
        return None
    new = frozenset(s for s in now if s not in measured)
    aged = frozenset(
        s for s in now if s in measured and max_age is not None and at - measured[s] >= max_age
    )
    said = []
    if new:
        said.append(f"pods run on {_names(new)}, not measured yet")
    if aged:
        said.append(f"{_names(aged)} last measured {duration_text(max_age)} ago or longer")
    if not said:
        return None
    return Reason("Sku", f"GPU SKUs: {'; '.join(said)} (measured: {_names(frozenset(measured))})")


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
        "MaxAge", f"last measured {duration_text(age)} ago (maximum age {duration_text(max_age)})"
    )


def traffic_shifted(
    baseline: Traffic,
    recent: Sequence[Traffic],
    percent: float,
    windows: int = 3,
    outcomes: Mapping[str, Outcome] | None = None,
) -> Reason | None:
    """Signals that moved from the baseline, in the same direction, by more than `percent` in
    each of the last `windows` windows, when one moves the curve in a way the last measurement
    (`outcomes`, per SKU) does not already answer: speedup pushed up where speculation paid at
    every batch measured on every SKU, or down where it paid at none, leaves it true. A move
    that pushes speedup down (lower acceptance, shorter outputs) in the last window while the
    SLO-met share fell beyond noise from the window before fires at once: speculation where it
    stopped paying costs requests every window it runs unnoticed, and two signals that agree
    in one window are not one noisy window (drafting falling from 0.6 to 0.25 a token on a
    busy L4 fleet lost 46% of the goodput of the five minutes after it while three windows
    passed, spectune-sim). The message names every signal that moved (longer prompts also
    slow the request rate: which moved tells what changed). One noisy window, or noise within
    the percent, never fires; a window where the signal is unknown breaks the run, and so does
    one whose admission was limited (`Traffic.admission_limited`): what it finished is what
    admission let through (an overloaded fleet moved its threshold from 4 to 16 on such a
    "shift", spectune-sim)."""
    moved: list[str] = []
    pushes: set[int] = set()  # which way the moved signals push speedup
    hurt = _slo_fell(recent)
    for label, (attr, rising) in TRAFFIC_SIGNALS.items():
        base = getattr(baseline, attr)
        if base is None or base <= 0:
            continue
        values = [None if w.admission_limited else getattr(w, attr) for w in recent]
        held = _held_move(base, values, percent, windows)
        last = _held_move(base, values, percent, 1) if hurt is not None else None
        if held is None and last is not None and (rising or 0) * last[0][0] < 0:
            held = last  # slows speculation, and requests miss their SLO
        if held is not None:
            changes, median = held
            n = len(changes)
            moved.append(
                f"{label} moved by at least {min(changes, key=abs):+.0f}% "
                f"({base:.3g} -> {median:.3g}) over {n} window{'s' if n > 1 else ''}"
                + (f" while the {hurt}" if n < windows else "")
            )
            if rising is not None:
                pushes.add(rising if changes[0] > 0 else -rising)
    found = set((outcomes or {}).values())
    answered = len(pushes) == 1 and found == {STILL_TRUE.get(next(iter(pushes)))}
    if not pushes or answered:
        return None
    return Reason(
        "Traffic",
        f"{'; '.join(moved)}, beyond the {percent:g}% trafficChangePercent",
        near=True,
    )


def _slo_fell(recent: Sequence[Traffic]) -> str | None:
    """How the SLO-met share fell from the window before the last to the last, where it fell
    beyond noise (the goodput check's test, with the windows before as its history)."""
    if len(recent) < 2:
        return None
    check = slo_share_drop(recent[-2], recent[-1], recent[:-1], since="the last")
    if check is None or check.verdict != "roll_back":
        return None
    return check.message


def _held_move(
    base: float, values: Sequence[float | None], percent: float, windows: int
) -> tuple[list[float], float] | None:
    """The changes (%) over the last `windows` values and their median value, where each is
    beyond `percent` the same way; else None."""
    known = [v for v in values[-windows:] if v is not None]
    if len(known) < windows:  # too few windows yet, or one unknown
        return None
    changes = [(v - base) / base * 100 for v in known]
    if all(c > percent for c in changes) or all(c < -percent for c in changes):
        return changes, sorted(known)[windows // 2]
    return None


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
    share: float = RARE_SHARE,
    min_steps: int = MIN_STEPS,
) -> Reason | None:
    """past_bound's mirror: where speculation paid at no batch the last calibration measured,
    its threshold turns speculation off only from the smallest batch measured, and smaller
    batches still speculate unmeasured. Once a share of a window's decode steps on that SKU
    that is not rare (`share`, at least `min_steps` of them) runs below it, a calibration
    measures them, exploring speculation past the threshold only below the floor: below it
    speculation runs anyway, so the calibration explores plain iterations there, which cost
    at most a window of plain steps at those batches where speculation pays. A busy L4 fleet
    running 5-8% of its steps below its floor of 8 lost 0.06% of its goodput to them against
    `never` until this measured them (spectune-sim, 30 seeds)."""
    for sku, floor in sorted(floors.items()):
        part = _share_of_steps(steps.get(sku, {}), lambda b, n=floor: b < n, share, min_steps)
        if part is not None:
            return Reason(
                "Traffic",
                f"{sku}: {part:.0%} of decode steps ran below batch {floor}, under the "
                "batches where speculation was measured not to pay",
                below=floor,
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
