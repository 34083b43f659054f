"""The batch-size gate: speculate only while the running batch is below the threshold.

The batch size is smoothed with fast attack and slow release: a rise is taken at once
(speculating on a big batch is what costs), a fall only decays the smoothed value. With
hysteresis on top, a batch hovering at the threshold turns speculation off once and
keeps it off, instead of flipping it every iteration. Because the smoothed value is
never below the actual batch, a gated spec iteration always has batch < threshold.

Exploration: a share ε of iterations deliberately runs the other mode, so the operator
can measure both curves at every batch size.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class GateSettings:
    threshold: int | None = None  # None: always speculate; 0: never
    hysteresis: float = 1.0  # once off, the smoothed batch must fall below threshold - this
    release: float = 0.25  # share of a fall taken per iteration
    exploration: float = 0.0  # ε, share of iterations run in the other mode

    def __post_init__(self) -> None:
        if self.threshold is not None and self.threshold < 0:
            raise ValueError(f"threshold must be >= 0 or unset, got {self.threshold}")
        if self.hysteresis < 0:
            raise ValueError(f"hysteresis must be >= 0, got {self.hysteresis}")
        if not 0 < self.release <= 1:
            raise ValueError(f"release must be in (0, 1], got {self.release}")
        if not 0 <= self.exploration <= 1:
            raise ValueError(f"exploration must be in [0, 1], got {self.exploration}")


@dataclass(frozen=True)
class Decision:
    speculate: bool
    explored: bool


class SpeculationGate:
    def __init__(self, settings: GateSettings, rng: random.Random) -> None:
        self._settings = settings
        self._rng = rng
        self._smoothed = 0.0
        self._on: bool | None = None  # None: no memory, decide on the threshold alone

    @property
    def settings(self) -> GateSettings:
        return self._settings

    @settings.setter
    def settings(self, new: GateSettings) -> None:
        """Swap atomically; the next decision uses the new threshold without hysteresis memory."""
        self._settings = new
        self._on = None

    @property
    def smoothed_batch(self) -> float:
        return self._smoothed

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
        explored = s.exploration > 0 and self._rng.random() < s.exploration
        return Decision(speculate=on != explored, explored=explored)
