"""The batch-size gate: speculate only while the running batch is below the threshold.

The batch size is smoothed with fast attack and slow release: a rise is taken at once
(speculating on a big batch is what costs), a fall only decays the smoothed value. With
hysteresis on top, a batch hovering at the threshold turns speculation off once and
keeps it off, instead of flipping it every iteration. Because the smoothed value is
never below the actual batch, a gated spec iteration always has batch < threshold.

Exploration: a share ε of iterations deliberately runs the other mode, so the operator
can measure both curves at every batch size. A lease raises ε until a wall-clock time: the
operator renews it while it calibrates, so an operator that dies leaves no engine exploring
for ever. The share is read from the wall clock at every decision, so expiry needs no input.

The base ε only explores plain iterations where the gate speculates; speculation where the
gate is off is explored under a lease alone. An explored spec iteration there makes the
draft first read everything the plain iterations committed since its last one, every new
request's prompt included: a forward that stalls the whole batch, worth paying while a
calibration measures and nowhere else (docs/PERFORMANCE.md, "Exploration past the threshold,
leased only": with base 2% there, auto served 0.65x the best fixed threshold on a trace).
A lease may bound that to batches below `below`: after a traffic shift the operator explores
near the crossover it last measured, not at batches far past it, where each explored spec
iteration costs the most and answers nothing the shift could have changed.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

log = logging.getLogger("spectune.engine")


@dataclass(frozen=True)
class Lease:
    """ε raised to `exploration` until `until` (unix seconds); after that, inert. Past the
    threshold it explores speculation only at batches below `below` (None: at every batch)."""

    exploration: float
    until: float
    below: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.exploration <= 1:
            raise ValueError(f"lease exploration must be in [0, 1], got {self.exploration}")
        if not self.until > 0:
            raise ValueError(f"lease until must be > 0 (unix seconds), got {self.until}")
        if self.below is not None and self.below < 1:
            raise ValueError(f"lease below must be >= 1 or unset, got {self.below}")

    def explores_past_threshold(self, batch_size: int) -> bool:
        """Whether an iteration of this batch, where the gate is off, may be explored."""
        return self.below is None or batch_size < self.below


@dataclass(frozen=True)
class GateSettings:
    threshold: int | None = None  # None: always speculate; 0: never
    hysteresis: float = 1.0  # once off, the smoothed batch must fall below threshold - this
    release: float = 0.25  # share of a fall taken per iteration
    exploration: float = 0.0  # ε, share of iterations run plain where the gate speculates
    lease: Lease | None = None  # a raised ε that reverts to `exploration` by itself

    def __post_init__(self) -> None:
        if self.threshold is not None and self.threshold < 0:
            raise ValueError(f"threshold must be >= 0 or unset, got {self.threshold}")
        if self.hysteresis < 0:
            raise ValueError(f"hysteresis must be >= 0, got {self.hysteresis}")
        if not 0 < self.release <= 1:
            raise ValueError(f"release must be in (0, 1], got {self.release}")
        if not 0 <= self.exploration <= 1:
            raise ValueError(f"exploration must be in [0, 1], got {self.exploration}")

    def exploration_at(self, now: float) -> float:
        """ε in force at unix time `now`: the lease's while it lasts, else the base."""
        if self.lease is not None and now < self.lease.until:
            return self.lease.exploration
        return self.exploration


@dataclass(frozen=True)
class Decision:
    speculate: bool
    explored: bool


class SpeculationGate:
    """`wall_clock` (unix seconds) times the lease: the operator sets `until` from its own
    clock, so this is the wall clock even when the engine runs on a simulated SKU's clock."""

    def __init__(
        self,
        settings: GateSettings,
        rng: random.Random,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._rng = rng
        self._wall_clock = wall_clock
        self._smoothed = 0.0
        self._on: bool | None = None  # None: no memory, decide on the threshold alone
        self._live: Lease | None = None  # the lease last seen in force, to log its expiry once

    @property
    def settings(self) -> GateSettings:
        return self._settings

    @settings.setter
    def settings(self, new: GateSettings) -> None:
        """Swap atomically; the next decision uses the new threshold without hysteresis memory."""
        self._settings = new
        self._on = None
        if new.lease != self._live:
            self._live = None  # replaced or withdrawn, not expired: nothing to log

    @property
    def smoothed_batch(self) -> float:
        return self._smoothed

    def exploration(self) -> float:
        """ε in force now; logs once when a lease that was in force has expired. Call it
        from the engine's thread (decide does; so does the serving loop while idle)."""
        s, now = self._settings, self._wall_clock()
        if s.lease is not None and now < s.lease.until:
            self._live = s.lease
        elif self._live is not None:
            expired = datetime.fromtimestamp(self._live.until, UTC).isoformat(timespec="seconds")
            log.info(
                "exploration lease expired at %s: back to base exploration %g",
                expired,
                s.exploration,
            )
            self._live = None
        return s.exploration_at(now)

    def decide(self, batch_size: int) -> Decision:
        s = self._settings
        if batch_size >= self._smoothed:
            self._smoothed = float(batch_size)
        else:
            self._smoothed += s.release * (batch_size - self._smoothed)
        if s.threshold is None:
            on = True
        else:
            margin = s.hysteresis if self._on is False else 0.0
            on = self._smoothed < s.threshold - margin
        self._on = on
        share = self.exploration()
        if not on and (self._live is None or not self._live.explores_past_threshold(batch_size)):
            share = 0.0  # past the threshold only a lease explores, and only within its range
        explored = share > 0 and self._rng.random() < share
        return Decision(speculate=on != explored, explored=explored)
