"""One turn of the operator for one SpecDeployment, as a pure function: from the status last
committed, the spec, the pods and what Prometheus showed, the status to commit next and what
the engines should run once it is committed. The handler commits first, then acts (DESIGN.md,
"commit then act"): an operator that dies between the two leaves engines on settings that
committed state explains, and raised exploration on a lease that expires by itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from spectune.operator import autotune, render
from spectune.operator.applying import Refusal
from spectune.operator.autotune import Event, Observation, State
from spectune.operator.models import Condition, SpecDeploymentSpec, SpecDeploymentStatus
from spectune.operator.observations import FleetWindow, MetricsUnavailable, Traffic
from spectune.operator.status import (
    condition,
    degraded,
    merge_patch,
    ready_since,
    rollout_conditions,
    threshold_status,
    unready_pods,
)

log = logging.getLogger(__name__)

# A ready engine that Prometheus scrapes has fresh, warm series this long after it became
# ready (the reader's 15 s warm-up and 30 s staleness), or five scrape intervals where those
# are longer; one without them by then is not scraped, and the MetricsAvailable condition
# says so. Before that it only holds a start.
SCRAPE_GRACE = timedelta(seconds=45)
GRACE_SCRAPES = 5


@dataclass(frozen=True)
class Target:
    """What one ready engine should run (the admin API's `PUT /admin/speculation` body): the
    ConfigMap's settings, from which the engine picks its own SKU's threshold, and a lease."""

    pod: str
    url: str  # http://IP:PORT
    threshold: int | None  # where `thresholds` has no entry for the engine's SKU
    thresholds: Mapping[str, int | None]  # GPU product -> threshold
    exploration: float  # the base share, 0..1
    lease: Mapping[str, float | None] | None  # {"exploration", "until", "below"}: while exploring

    def threshold_on(self, device: str) -> int | None:
        """The threshold an engine on `device` (its `spectune_engine_info` label) runs."""
        return self.thresholds.get(device, self.threshold)


@dataclass(frozen=True)
class Turn:
    state: State
    events: tuple[Event, ...]
    status: dict[str, Any]  # a merge patch over the status the turn read
    config: dict[str, Any]  # the engines' settings file (the ConfigMap)
    engines: tuple[Target, ...]


def saved_state(spec: SpecDeploymentSpec, status: Mapping[str, Any]) -> State:
    """The autotuner's state as the last committed status holds it."""
    saved = SpecDeploymentStatus.model_validate(dict(status))
    return State(
        threshold=threshold_status(spec, saved.threshold),
        crossover=saved.crossover,
        per_sku=tuple(saved.perSku),
        calibration=saved.calibration,
    )


def exploration_lease(
    state: State, now: datetime, lease_seconds: float
) -> dict[str, float | None] | None:
    """While exploring: the raised share until a unix time, which engines drop by themselves
    unless a later turn renews it, within the calibration's batch range. The expiry is rounded
    up to half a lease, so that the ConfigMap changes once every half lease rather than every
    turn, and expires between one and one and a half leases after the last turn that renewed
    it."""
    if state.calibration.phase != "Exploring":
        return None
    half = lease_seconds / 2
    until = math.ceil((now.timestamp() + lease_seconds) / half) * half
    return {
        "exploration": autotune.CALIBRATION_EXPLORATION_PERCENT / 100,
        "until": until,
        "below": state.calibration.exploreBelow,
    }


def observe(
    spec: SpecDeploymentSpec,
    state: State,
    pods: list[dict[str, Any]],
    now: datetime,
    read: Callable[[int], FleetWindow],
    recent: Sequence[tuple[datetime, Traffic]],
    selector: str,
    interval: float | None = None,
    diagnose: Callable[[list[str]], Mapping[str, str]] | None = None,
) -> Observation:
    """What this turn sees: the pods, and the engines' window `read` returns over the seconds
    the calibration phase asks for (Prometheus for the operator, the simulator's scrapes for
    spectune-sim) at the scrape `interval` last observed; for ready pods overdue without
    series, why, as `diagnose` finds (Prometheus's targets). Manual reads nothing: the pin
    needs no measurement."""
    spec = autotune.with_window(spec, interval)
    unready = unready_pods(pods)
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    ready = len(live) - len(unready)
    settled = ready == spec.replicas == len(live)
    if spec.speculation.threshold.mode == "Manual":
        return Observation(now, ready, settled, None)
    since = [t for p in live if (t := ready_since(p)) is not None]
    ready_at = max(since) if since else None
    seconds = autotune.window_seconds(spec, state.calibration, now, ready_at, interval)
    without = functools.partial(
        Observation, now, ready, settled, None, selector=selector, ready_at=ready_at
    )
    try:
        window = read(seconds)
    except MetricsUnavailable as err:
        return without(error=str(err))
    except Exception as err:  # whatever else a read raises, the turn goes on without a window
        log.exception("reading the engines' metrics failed")
        return without(error=repr(err)[:300], error_reason="MetricsReadFailed")
    problems: Mapping[str, str] = {}
    serving = ready_pods(pods)
    late = overdue(serving, [p for p in serving if p not in window.engines], now, window)
    if late and diagnose is not None:
        with contextlib.suppress(MetricsUnavailable):  # the condition then says less
            problems = diagnose(late)
    return Observation(
        now, ready, settled, window, recent, selector=selector, ready_at=ready_at,
        scrape_problems=problems,
    )  # fmt: skip


def ready_pods(pods: list[dict[str, Any]]) -> dict[str, datetime | None]:
    """Each ready engine pod (not going away) -> since when (None: its kubelet wrote no time)."""
    not_ready = {u.split(":", 1)[0] for u in unready_pods(pods)}
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    names = {p["metadata"]["name"]: ready_since(p) for p in live}
    return {pod: since for pod, since in names.items() if pod not in not_ready}


def overdue(
    ready: Mapping[str, datetime | None],
    unscraped: Sequence[str],
    now: datetime,
    window: FleetWindow,
) -> list[str]:
    """The `unscraped` pods ready longer than Prometheus needs to scrape a new engine."""
    grace = max(SCRAPE_GRACE, timedelta(seconds=GRACE_SCRAPES * (window.scrape_interval or 0)))
    return [pod for pod in unscraped if (since := ready.get(pod)) is None or now - since >= grace]


def tune(
    name: str,
    spec: SpecDeploymentSpec,
    status: Mapping[str, Any],
    generation: int | None,
    pods: list[dict[str, Any]],
    rollout: Mapping[str, Any],
    observation: Observation,
    lease_seconds: float,
    apply_error: Refusal | None = None,
    interval: float | None = None,
) -> Turn:
    """Step the calibration and derive the status and the engines' settings from the result.
    `rollout`: the engine Deployment's status; `apply_error`: why the last turn's children
    were not applied, if they were not; `interval`: the scrape interval last seen, which sets
    the calibration window where the spec leaves it unset. Every engine gets the same
    settings, each SKU's threshold in them (an engine, not the operator, knows its SKU for
    sure: a pod whose SKU the operator had to guess once got another SKU's threshold); raised
    exploration goes only to engines whose series Prometheus holds, since only their steps can
    be measured."""
    spec = autotune.with_window(spec, interval)
    now = observation.now
    before = saved_state(spec, status)
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    unready = unready_pods(pods)
    ready = ready_pods(pods)
    if observation.window is not None:
        scraped = observation.window.engines
        missing = tuple(sorted(pod for pod in ready if pod not in scraped))
        observation = dataclasses.replace(observation, unscraped=missing)
    tuned, observation = decide(spec, before, observation)
    state = tuned.state
    events = tuned.events
    base = spec.tuning.explorationPercent / 100
    lease = exploration_lease(state, now, lease_seconds)
    scraped = observation.window.engines if observation.window is not None else {}
    threshold, _ = autotune.engine_settings(spec, state, None)
    thresholds = autotune.thresholds_by_sku(state)
    config = render.engine_config(spec, threshold, spec.tuning.explorationPercent, thresholds)
    engines = tuple(
        Target(
            pod=p["metadata"]["name"],
            url=f"http://{p['status']['podIP']}:{spec.engine.port}",
            threshold=threshold,
            thresholds=thresholds,
            exploration=base,
            lease=lease if p["metadata"]["name"] in scraped else None,
        )
        for p in live
        if p["metadata"]["name"] in ready and (p.get("status") or {}).get("podIP")
    )
    previous = list(status.get("conditions") or [])
    conditions = rollout_conditions(spec.replicas, dict(rollout), unready, previous, now)
    conditions.append(condition("Calibrated", *autotune.calibrated(spec, state), now, previous))
    if observation.error:
        why = f"{observation.blind[:300]}: threshold kept"
        conditions = degraded(conditions, observation.error_reason, why, now, previous)
    if apply_error is not None:
        why = apply_error.message
        if apply_error.reason == "ApplyFailed":
            why = f"the API server refused the engines' objects: {why}"
        conditions = degraded(conditions, apply_error.reason, why, now, previous)
    if spec.speculation.threshold.mode != "Manual":
        metrics = metrics_available(spec, observation, ready, previous)
        conditions.append(metrics)
        was = next((c for c in previous if c.get("type") == metrics.type), {})
        if metrics.status == "False" and was.get("status") != "False":
            events += (Event(metrics.reason, metrics.message, warning=True),)
    patch = {
        "observedGeneration": generation,
        "replicas": rollout.get("replicas") or 0,
        "readyReplicas": rollout.get("readyReplicas") or 0,
        "selector": render.selector_string(name),
        "calibrationWindowSeconds": spec.tuning.calibrationWindowSeconds,
        "threshold": state.threshold.model_dump(),
        # None deletes a field in a merge patch: a crossover no longer crossed loses its
        # batch size, and its curve the buckets this measurement did not reach (nulls
        # inside lists would not validate, so theirs are left out)
        "crossover": merge_patch(status.get("crossover"), state.crossover.model_dump()),
        "perSku": [s.model_dump(exclude_none=True) for s in state.per_sku],
        "calibration": merge_patch(
            status.get("calibration"), state.calibration.model_dump(exclude_none=True)
        ),
        "conditions": [c.model_dump(mode="json", exclude_none=True) for c in conditions],
    }
    return Turn(state, events, patch, config, engines)


def decide(
    spec: SpecDeploymentSpec, state: State, observation: Observation
) -> tuple[autotune.Step, Observation]:
    """`autotune.step`, and the observation it decided on. Where it raises (a window no test
    foresaw), the step of a turn without a window: a raising decision must not stall the state
    machine, so exploration is lowered and a change under verification still meets its
    deadline (rolled back), while the Degraded condition says why."""
    try:
        return autotune.step(spec, state, observation), observation
    except Exception as err:
        log.exception("deciding on the engines' metrics failed")
        blind = dataclasses.replace(
            observation, window=None, error=repr(err)[:300], error_reason="DecisionFailed"
        )
        return autotune.step(spec, state, blind), blind


def metrics_available(
    spec: SpecDeploymentSpec,
    observation: Observation,
    ready: Mapping[str, datetime | None],
    previous: list[dict],
) -> Condition:
    """Whether Prometheus holds fresh series for every ready engine, scraped often enough for
    the calibration window: no calibration starts until it does. A pod ready for the grace
    without series is named, with the selector queried (a PodMonitor nobody selects is the
    usual cause on a fresh install); a window holding too few scrapes says so."""
    now = observation.now
    if observation.window is None:
        why = observation.blind[:300]
        return condition("MetricsAvailable", False, observation.error_reason, why, now, previous)
    interval = observation.window.scrape_interval
    late = overdue(ready, observation.unscraped, now, observation.window)
    if late:
        problems = observation.scrape_problems
        why = "; ".join(f"{pod}: {problems[pod]}" for pod in late if pod in problems) or (
            "check that a PodMonitor or scrape config selects these pods and keeps the labels "
            "the operator's --prometheus-*-label flags name"
        )
        message = (
            f"no fresh engine series in Prometheus for the ready pods {', '.join(late)} "
            f"(queried with {observation.selector or 'the deployment selector'}): no "
            f"calibration until they are scraped; {why}"
        )
        return condition("MetricsAvailable", False, "EnginesNotScraped", message, now, previous)
    if too_short := autotune.window_too_short(spec, interval):
        message = f"{too_short}: no calibration until the window is longer"
        return condition(
            "MetricsAvailable", False, "CalibrationWindowTooShort", message, now, previous
        )
    scraped = len(ready) - len(observation.unscraped)
    warming = f"; {len(observation.unscraped)} warming up" if observation.unscraped else ""
    message = f"{scraped} of {len(ready)} ready engines scraped{warming}"
    return condition("MetricsAvailable", True, "EnginesScraped", message, now, previous)
