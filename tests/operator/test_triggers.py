"""Change detection: each trigger fires on its change with a readable reason and stays quiet
on no change, unknown data and noise."""

from __future__ import annotations

import dataclasses
import random
from datetime import UTC, datetime, timedelta

import pytest

from spectune.engine.crossover import ModeStats, StatsByBucket
from spectune.operator.models import Outcome, parse_spec
from spectune.operator.observations import Traffic
from spectune.operator.triggers import (
    SpecKey,
    replicas_changed,
    skus_unmeasured,
    spec_changed,
    too_old,
    traffic_shifted,
)

H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB"
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
WINDOW = 60.0


def traffic(
    rate: float = 10.0,
    tokens: float = 100.0,
    acceptance: float = 0.6,
    prompt: float = 64.0,
    engines: float = 1.0,
    slo_met: float = 0.95,
) -> Traffic:
    requests = rate * WINDOW
    return Traffic(
        seconds=WINDOW,
        engines=engines,
        requests=requests,
        ok_requests=requests,
        rejected_requests=0.0,
        slo_met=requests * slo_met,
        prompt_tokens=requests * prompt,
        decode_tokens=requests * tokens,
        drafted_tokens=1000.0,
        accepted_tokens=1000.0 * acceptance,
    )


def steps_at(*buckets: int, n: int = 100) -> dict[str, StatsByBucket]:
    return {H100: {("plain", b): ModeStats(n, n * b, 0.01 * n) for b in buckets}}


def test_replicas_re_measure_only_where_the_load_leaves_the_measured_batches() -> None:
    covered = {H100: [8, 32]}
    assert replicas_changed(2, 2, covered, steps_at(64)) is None
    assert replicas_changed(2, 3, covered, steps_at(8, 12, 16)) is None  # the HPA's case
    assert replicas_changed(2, 3, covered, steps_at(4, 8, 12)) is None  # 1 in 3 outside
    assert replicas_changed(2, 1, covered, steps_at(64, n=10)) is None  # too few steps
    assert replicas_changed(2, 1, covered, {}) is None  # nothing read yet after the change
    reason = replicas_changed(2, 1, covered, steps_at(32, 48, 64))
    assert reason is not None and reason.kind == "Replicas"
    assert reason.message == (
        f"replicas changed from 2 to 1, and 67% of decode steps on {H100} ran outside batches "
        "8-32, the range last measured"
    )
    below = replicas_changed(2, 4, {H100: [8, 8]}, steps_at(2, 3, 4))
    assert below is not None and f"100% of decode steps on {H100} ran outside batch 8," in (
        below.message
    )
    old = replicas_changed(2, 3)  # a baseline from before coverage: any change
    assert old is not None and old.message == "replicas changed from 2 to 3"


def test_a_sku_re_measures_only_when_new_or_aged_and_an_unknown_set_is_no_change() -> None:
    """Pods on a SKU not measured yet re-measure; a SKU that left, or one that left and came back
    with its measurement younger than the maximum age, does not (issue 59, E: an HPA scaling a
    mixed fleet's only L4 pod away and back re-explored every batch twice)."""
    age = timedelta(hours=1)
    h100 = {H100: T0}
    assert skus_unmeasured(h100, frozenset({H100}), T0, age) is None
    assert skus_unmeasured(h100, frozenset(), T0, age) is None  # pods not placed yet
    assert skus_unmeasured({}, frozenset({H100}), T0, age) is None  # nothing measured before
    both = {H100: T0, A100: T0 - timedelta(minutes=50)}
    assert skus_unmeasured(both, frozenset({H100}), T0, age) is None  # the A100 left
    assert skus_unmeasured(both, frozenset({A100, H100}), T0, age) is None  # ... and is back
    reason = skus_unmeasured(h100, frozenset({A100, H100}), T0, age)
    assert reason is not None and reason.kind == "Sku"
    assert reason.message == f"GPU SKUs: pods run on {A100}, not measured yet (measured: {H100})"
    aged = skus_unmeasured(both, frozenset({A100, H100}), T0 + timedelta(minutes=10), age)
    assert aged is not None and aged.message == (
        f"GPU SKUs: {A100} last measured 1h00m ago or longer (measured: {A100}, {H100})"
    )


def test_spec_changes_of_model_draft_method_or_k_and_not_of_the_threshold() -> None:
    base = {"model": {"name": "tiny-target"}, "speculation": {"method": "ngram"}}
    before = SpecKey.of(parse_spec(base))
    pinned = base | {
        "speculation": {"method": "ngram", "threshold": {"mode": "Manual", "value": 8}},
        "replicas": 5,
    }
    assert spec_changed(before, SpecKey.of(parse_spec(pinned))) is None
    drafted = base | {
        "speculation": {"method": "draft", "draft": "tiny-draft", "numSpeculativeTokens": 2}
    }
    reason = spec_changed(before, SpecKey.of(parse_spec(drafted)))
    assert reason is not None and reason.kind == "Spec"
    assert (
        reason.message == "spec changed: draft None -> tiny-draft, method ngram -> draft, k 4 -> 2"
    )
    other_model = base | {"model": {"name": "other"}}
    reason = spec_changed(before, SpecKey.of(parse_spec(other_model)))
    assert reason is not None and "model tiny-target -> other" in reason.message


def test_max_age() -> None:
    hour = timedelta(hours=1)
    assert too_old(T0, T0 + timedelta(minutes=59), hour) is None
    reason = too_old(T0, T0 + timedelta(minutes=61, seconds=5), hour)
    assert reason is not None and reason.kind == "MaxAge"
    assert reason.message == "last measured 1h01m ago (maximum age 1h00m)"


def test_noise_within_the_percent_never_fires() -> None:
    rng = random.Random(0)
    base = traffic()
    history = []
    for _ in range(500):  # every signal wanders up to 25% either way; the percent is 30
        history.append(
            traffic(
                10 * rng.uniform(0.75, 1.25),
                100 * rng.uniform(0.75, 1.25),
                0.6 * rng.uniform(0.75, 1.25),
                64 * rng.uniform(0.75, 1.25),
            )
        )
        assert traffic_shifted(base, history, percent=30) is None


@pytest.mark.parametrize(
    "shifted, signal",
    [
        (traffic(tokens=200), "output tokens per request"),
        (traffic(prompt=512), "prompt tokens per request"),
        (traffic(acceptance=0.3), "acceptance rate"),
    ],
)
def test_a_shift_held_for_the_windows_fires_naming_the_signal(
    shifted: Traffic, signal: str
) -> None:
    base = traffic()
    assert traffic_shifted(base, [base, shifted, shifted], percent=30) is None  # 2 of 3
    reason = traffic_shifted(base, [base, shifted, shifted, shifted], percent=30)
    assert reason is not None and reason.kind == "Traffic"
    assert reason.message.startswith(signal) and "over 3 windows" in reason.message
    assert "30% trafficChangePercent" in reason.message


def test_a_move_that_slows_speculation_as_requests_miss_their_slo_fires_at_once() -> None:
    """Drafting that collapses (or outputs that shorten) slows speculation where it runs, and
    costs requests every window it goes unnoticed: in the window where the SLO-met share also
    fell beyond noise from the one before, it fires, naming both. Either alone waits for the
    windows, as does a move that speeds speculation up, or a change of prompt length."""
    base, poorer = traffic(), traffic(acceptance=0.3)
    missing = traffic(acceptance=0.3, slo_met=0.6)
    reason = traffic_shifted(base, [base, base, missing], percent=30)
    assert reason is not None and reason.message == (
        "acceptance rate moved by at least -50% (0.6 -> 0.3) over 1 window while the SLO-met "
        "share fell from 95.0% to 60.0% (beyond noise, and beyond the 0.0% it moved between "
        "the windows before the last), beyond the 30% trafficChangePercent"
    )
    assert traffic_shifted(base, [base, missing], percent=30) is not None
    assert traffic_shifted(base, [missing], percent=30) is None  # nothing to compare with
    assert traffic_shifted(base, [base, base, poorer], percent=30) is None  # SLO held
    assert traffic_shifted(base, [base, base, traffic(slo_met=0.6)], percent=30) is None
    assert traffic_shifted(base, [base, base, traffic(acceptance=0.5, slo_met=0.6)], 30) is None
    busier = traffic(rate=20, acceptance=0.3, slo_met=0.6)  # load not comparable: no verdict
    assert traffic_shifted(base, [base, base, busier], percent=30) is None
    shorter = traffic_shifted(base, [base, traffic(tokens=50, slo_met=0.6)], percent=30)
    assert shorter is not None and shorter.message.startswith("output tokens per request")
    for up in ({"acceptance": 0.9}, {"tokens": 200}, {"prompt": 512}):
        assert traffic_shifted(base, [base, traffic(**up, slo_met=0.6)], percent=30) is None


def test_every_signal_that_moved_is_named() -> None:
    base, longer = traffic(), traffic(rate=5, prompt=512)
    reason = traffic_shifted(base, [longer] * 3, percent=30)
    assert reason is not None
    assert reason.message.startswith(
        "request rate per engine moved by at least -50% (10 -> 5) over 3 windows; "
    )
    assert "prompt tokens per request moved by at least +700% (64 -> 512) over 3" in reason.message
    assert "acceptance" not in reason.message and "output" not in reason.message


@pytest.mark.parametrize(
    "load", [{"rate": 14}, {"rate": 6}, {"engines": 2}], ids=["up", "down", "spread"]
)
def test_a_load_shift_alone_re_measures_nothing(load: dict[str, float]) -> None:
    """The request rate per engine moves the batches each pod runs, not the speedup curve: held
    for every window it fires nothing alone (the bound and floor triggers judge the batches it
    reaches), and it is named beside a signal that moves the curve."""
    base = traffic()
    assert traffic_shifted(base, [traffic(**load)] * 5, percent=30) is None
    longer = traffic(**load, prompt=512)
    reason = traffic_shifted(base, [longer] * 3, percent=30)
    assert reason is not None and reason.message.startswith("request rate per engine moved")
    assert "; prompt tokens per request moved by at least +700%" in reason.message


@pytest.mark.parametrize(
    ("shifted", "outcomes", "fires"),
    [
        ({"acceptance": 0.3}, {H100: "never_pays"}, False),  # speedup down: still pays at none
        ({"acceptance": 0.3}, {H100: "crosses"}, True),  # the crossing moves
        ({"acceptance": 0.3}, {H100: "always_pays"}, True),
        ({"acceptance": 0.3}, {H100: "never_pays", A100: "crosses"}, True),
        ({"acceptance": 0.3}, {}, True),  # nothing recorded: re-measure
        ({"acceptance": 0.9}, {H100: "always_pays"}, False),  # speedup up: still pays at every
        ({"acceptance": 0.9}, {H100: "never_pays"}, True),
        ({"tokens": 60}, {H100: "never_pays"}, False),  # shorter outputs: more prefill a token
        ({"tokens": 160}, {H100: "never_pays"}, True),
        ({"tokens": 160}, {H100: "always_pays", A100: "always_pays"}, False),
        ({"prompt": 512}, {H100: "never_pays"}, True),  # longer prompts: either way
        ({"acceptance": 0.9, "tokens": 60}, {H100: "never_pays"}, True),  # pushes disagree
        ({"acceptance": 0.3, "rate": 20}, {H100: "never_pays"}, False),  # the busy fleet's case
    ],
)
def test_a_shift_a_one_sided_measurement_already_answers_re_measures_nothing(
    shifted: dict[str, float], outcomes: dict[str, Outcome], fires: bool
) -> None:
    """Speedup pushed down where speculation paid at no batch measured (or up where it paid at
    every one) leaves the finding true: the shift is not re-measured. A crossing moves, and a
    signal that can push either way (prompt length) or pushes that disagree re-measure."""
    reason = traffic_shifted(traffic(), [traffic(**shifted)] * 3, percent=30, outcomes=outcomes)
    assert (reason is not None) is fires, reason


def test_a_load_rise_that_replicas_absorb_is_not_named() -> None:
    """An HPA doubles the replicas as the load doubles: what each engine serves, and so its
    batches, did not move."""
    base = traffic(rate=10, engines=2)
    absorbed, kept = (
        traffic(rate=20, engines=4, prompt=512),
        traffic(rate=20, engines=2, prompt=512),
    )
    reason = traffic_shifted(base, [absorbed] * 3, percent=30)
    assert reason is not None and reason.message.startswith("prompt tokens per request")
    reason = traffic_shifted(base, [kept] * 3, percent=30)
    assert reason is not None and reason.message.startswith("request rate per engine")


def test_a_spike_or_a_shift_that_flips_direction_does_not_fire() -> None:
    base = traffic()
    spike = [traffic(), traffic(acceptance=0.2), traffic()]
    assert traffic_shifted(base, spike, percent=30, windows=3) is None
    flip = [traffic(acceptance=0.9), traffic(acceptance=0.3), traffic(acceptance=0.9)]
    assert traffic_shifted(base, flip, percent=30) is None


def test_unknown_traffic_never_fires() -> None:
    base = traffic()
    unknown = Traffic(seconds=WINDOW)
    longer = traffic(prompt=512)
    assert traffic_shifted(base, [longer, unknown, longer], 30) is None
    assert traffic_shifted(unknown, [longer] * 3, 30) is None
    assert unknown.request_rate is None and unknown.acceptance is None
    no_drafts = Traffic(seconds=WINDOW, drafted_tokens=0.0, accepted_tokens=0.0)
    assert no_drafts.acceptance is None  # nothing drafted: unknown, not 0% acceptance


def test_windows_whose_admission_was_limited_shift_nothing() -> None:
    """Issue 59, N: in an overload the requests a window finishes are those admission let
    through, and their SLO-met share follows the queue, not the threshold: an overloaded fleet
    moved its threshold from 4 to 16 on such a "shift" (spectune-sim). A window that refused
    more than 2% of its requests, or kept more than one an engine waiting for admission, counts
    as unknown: it breaks a run of shifted windows, and it judges no SLO share."""
    base, shifted = traffic(), traffic(tokens=200)
    refusing = dataclasses.replace(shifted, rejected_requests=0.05 * shifted.requests)
    queueing = dataclasses.replace(shifted, mean_waiting=3.0)
    assert not shifted.admission_limited
    assert refusing.admission_limited and queueing.admission_limited
    assert traffic_shifted(base, [base, shifted, shifted, shifted], percent=30) is not None
    for limited in (refusing, queueing):
        assert traffic_shifted(base, [base, shifted, limited, shifted], percent=30) is None
    missing = dataclasses.replace(traffic(acceptance=0.3, slo_met=0.6), mean_waiting=5.0)
    assert traffic_shifted(base, [base, base, missing], percent=30) is None
    overloaded = dataclasses.replace(base, mean_waiting=5.0)
    assert (
        traffic_shifted(base, [base, overloaded, traffic(acceptance=0.3, slo_met=0.6)], 30) is None
    )
    assert Traffic(seconds=WINDOW).admission_limited is None  # nothing known
