"""The operator in the simulation: the same pure turn the kopf daemon takes (tuning.observe,
tuning.tune), with the status committed to a dict instead of the API server (a merge patch,
as the API server applies it) and the process memory (traffic windows, the scrape interval)
kept until a simulated restart drops it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from spectune.operator import tuning
from spectune.operator.fleet_memory import record_window
from spectune.operator.models import SpecDeploymentSpec
from spectune.operator.observations import FleetWindow, Traffic
from spectune.operator.status import merge_patched

SELECTOR = '{namespace="sim"}'


class SimOperator:
    def __init__(self, name: str, lease_seconds: float) -> None:
        self.name = name
        self.lease_seconds = lease_seconds
        self.status: dict[str, Any] = {}
        self.generation = 1
        self.traffic: list[tuple[datetime, Traffic]] = []
        self.interval: float | None = None  # the scrape interval the last read saw

    def restart(self) -> None:
        """A new operator process: status survives (it is in the API server), memory does not."""
        self.traffic, self.interval = [], None

    def turn(
        self,
        now: float,
        spec: SpecDeploymentSpec,
        pods: list[dict[str, Any]],
        rollout: dict[str, Any],
        read: Callable[[int], FleetWindow],
    ) -> tuning.Turn:
        """Observe, decide and commit one turn at unix time `now`."""
        when = datetime.fromtimestamp(round(now), UTC)
        state = tuning.saved_state(spec, self.status)
        observation = tuning.observe(
            spec, state, pods, when, read, self.traffic, SELECTOR, self.interval
        )
        self.interval = observation.scrape_interval_or(self.interval)
        turn = tuning.tune(
            self.name,
            spec,
            self.status,
            self.generation,
            pods,
            rollout,
            observation,
            self.lease_seconds,
            interval=self.interval,
        )
        self.status = merge_patched(self.status, turn.status)
        if observation.window is not None and turn.state.calibration.phase == "Idle":
            self.traffic = record_window(self.traffic, when, observation.window.traffic)
        return turn
