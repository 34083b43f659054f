"""The batch gate: threshold semantics, hysteresis, run-time changes, exploration."""

from __future__ import annotations

import itertools
import random

import pytest

from spectune.engine.gate import GateSettings, SpeculationGate


def gate(**kw: object) -> SpeculationGate:
    return SpeculationGate(GateSettings(**kw), random.Random(0))


def modes(g: SpeculationGate, batches: list[int]) -> list[bool]:
    return [g.decide(n).speculate for n in batches]


def test_unset_threshold_always_speculates_and_zero_never() -> None:
    assert all(modes(gate(threshold=None), [1, 8, 64, 512]))
    assert not any(modes(gate(threshold=0), [1, 8, 64, 512]))


def test_speculates_only_below_threshold_for_any_batch_trace() -> None:
    rng = random.Random(7)
    trace = [rng.choice([1, 2, 3, 5, 7, 8, 9, 12, 16]) for _ in range(2000)]
    g = gate(threshold=8)
    decisions = modes(g, trace)
    assert all(n < 8 for n, spec in zip(trace, decisions, strict=True) if spec)
    assert any(decisions) and not all(decisions)


def test_rise_to_threshold_turns_speculation_off_at_once() -> None:
    g = gate(threshold=8)
    assert modes(g, [2, 2, 2, 8]) == [True, True, True, False]


def test_batch_hovering_at_threshold_does_not_flip_every_iteration() -> None:
    g = gate(threshold=8, hysteresis=1.0)
    decisions = modes(g, [7, 8] * 50)
    flips = sum(a != b for a, b in itertools.pairwise(decisions))
    assert flips <= 1
    # ...and comes back once the batch really falls below threshold - hysteresis.
    assert modes(g, [4] * 10)[-1] is True


def test_threshold_change_applies_at_next_iteration() -> None:
    g = gate(threshold=16)
    assert modes(g, [8, 8]) == [True, True]
    g.settings = GateSettings(threshold=4)
    assert g.decide(8).speculate is False
    g.settings = GateSettings(threshold=32)
    assert g.decide(8).speculate is True
    g.settings = GateSettings(threshold=0)
    assert g.decide(1).speculate is False


@pytest.mark.parametrize(("batch", "picked"), [(2, True), (20, False)])
def test_exploration_runs_the_other_mode_at_the_configured_share(batch: int, picked: bool) -> None:
    """Below the threshold a share runs plain; above it a share speculates."""
    g = gate(threshold=8, exploration=0.1)
    decisions = [g.decide(batch) for _ in range(5000)]
    explored = [d for d in decisions if d.explored]
    assert 0.08 < len(explored) / len(decisions) < 0.12
    assert all(d.speculate is not picked for d in explored)
    assert all(d.speculate is picked for d in decisions if not d.explored)


@pytest.mark.parametrize(
    "kw", [{"threshold": -1}, {"hysteresis": -0.5}, {"release": 0.0}, {"exploration": 1.5}]
)
def test_invalid_settings_are_rejected(kw: dict) -> None:
    with pytest.raises(ValueError):
        GateSettings(**kw)
