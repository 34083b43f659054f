"""The batch gate: threshold semantics, hysteresis, run-time changes, exploration and its
lease."""

from __future__ import annotations

import itertools
import logging
import random

import pytest

from spectune.engine.gate import GateSettings, Lease, SpeculationGate


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


def explored_share(g: SpeculationGate, batch: int, n: int = 5000) -> float:
    """The share of `n` decisions at `batch` that ran the other mode; every other decision
    ran the mode the threshold picks."""
    decisions = [g.decide(batch) for _ in range(n)]
    picked = batch < (g.settings.threshold or 0) or g.settings.threshold is None
    assert all(d.speculate is not picked for d in decisions if d.explored)
    assert all(d.speculate is picked for d in decisions if not d.explored)
    return sum(d.explored for d in decisions) / n


def test_base_exploration_runs_plain_at_its_share_where_the_gate_speculates() -> None:
    assert 0.08 < explored_share(gate(threshold=8, exploration=0.1), 2) < 0.12
    assert 0.08 < explored_share(gate(threshold=None, exploration=0.1), 200) < 0.12


def test_base_exploration_never_speculates_past_the_threshold() -> None:
    """There an explored spec iteration makes the draft read all the plain iterations
    committed first, a stall of the batch: only a calibration's lease pays it."""
    assert explored_share(gate(threshold=8, exploration=0.1), 20) == 0.0
    assert explored_share(gate(threshold=0, exploration=1.0), 1) == 0.0


@pytest.mark.parametrize("batch", [2, 20])
def test_a_lease_explores_both_modes_at_its_share(batch: int) -> None:
    lease = Lease(0.1, 2000.0)
    g = SpeculationGate(
        GateSettings(threshold=8, exploration=0.0, lease=lease),
        random.Random(0),
        wall_clock=FakeWallClock(1000.0),
    )
    assert 0.08 < explored_share(g, batch) < 0.12


@pytest.mark.parametrize(("batch", "explored"), [(2, True), (20, True), (31, True), (32, False)])
def test_a_bounded_lease_explores_speculation_only_below_its_bound(
    batch: int, explored: bool
) -> None:
    """Past the threshold a lease bounded at 32 speculates at its share up to batch 31 and
    never from 32 up; below the threshold it still runs plain at its share."""
    g = SpeculationGate(
        GateSettings(threshold=8, exploration=0.0, lease=Lease(0.1, 2000.0, below=32)),
        random.Random(0),
        wall_clock=FakeWallClock(1000.0),
    )
    share = explored_share(g, batch)
    assert (0.08 < share < 0.12) if explored else share == 0.0


@pytest.mark.parametrize(
    "kw", [{"threshold": -1}, {"hysteresis": -0.5}, {"release": 0.0}, {"exploration": 1.5}]
)
def test_invalid_settings_are_rejected(kw: dict) -> None:
    with pytest.raises(ValueError):
        GateSettings(**kw)


@pytest.mark.parametrize(
    ("share", "until", "below"), [(1.5, 100.0, None), (-0.1, 100.0, None), (0.5, 0.0, None),
                                  (0.5, 100.0, 0)]
)  # fmt: skip
def test_invalid_leases_are_rejected(share: float, until: float, below: int | None) -> None:
    with pytest.raises(ValueError, match="lease"):
        Lease(share, until, below)


class FakeWallClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def leased(clock: FakeWallClock, **kw: object) -> SpeculationGate:
    settings = GateSettings(threshold=None, exploration=0.0, lease=Lease(1.0, 1000.0), **kw)
    return SpeculationGate(settings, random.Random(0), wall_clock=clock)


def test_a_lease_explores_until_it_expires_and_never_after() -> None:
    """Expiry is read at every decision: no settings change brings the base share back."""
    clock = FakeWallClock(900.0)
    g = leased(clock)
    before = []
    for _ in range(50):
        before.append(g.decide(4))
        clock.now += 1.0  # 900 .. 949, all before `until`
    assert all(d.explored and not d.speculate for d in before)
    clock.now = 1000.0  # `until` itself is past the lease
    after = [g.decide(4) for _ in range(200)]
    assert not any(d.explored for d in after) and all(d.speculate for d in after)
    assert g.exploration() == 0.0


def test_a_lease_already_past_is_inert() -> None:
    g = leased(FakeWallClock(5000.0))
    assert g.exploration() == 0.0
    assert not any(g.decide(4).explored for _ in range(200))


def test_expiry_is_logged_once_and_a_withdrawal_not_at_all(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeWallClock(999.0)
    g = leased(clock)
    caplog.set_level(logging.INFO, logger="spectune.engine")
    g.decide(4)
    clock.now = 1001.0
    for _ in range(10):
        g.decide(4)
    g.settings = GateSettings(threshold=4, lease=Lease(1.0, 1000.0))  # the same lease again
    g.decide(4)
    expired = [r.getMessage() for r in caplog.records if "lease expired" in r.getMessage()]
    assert expired == [
        "exploration lease expired at 1970-01-01T00:16:40+00:00: back to base exploration 0"
    ]

    caplog.clear()
    clock.now = 1500.0
    g.settings = GateSettings(lease=Lease(0.5, 2000.0))
    assert g.exploration() == 0.5
    g.settings = GateSettings(exploration=0.02)  # withdrawn before its time
    clock.now = 3000.0
    assert g.exploration() == 0.02
    assert not [r for r in caplog.records if "lease expired" in r.getMessage()]
