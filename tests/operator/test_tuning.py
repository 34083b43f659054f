"""One turn, without a cluster: what is committed and what the engines are then told. Raised
exploration goes out only as a lease, Manual reaches every pod, and a pod's SKU picks its
threshold."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from spectune.operator import autotune, render
from spectune.operator.applying import Refusal
from spectune.operator.observations import FleetWindow, MetricsUnavailable
from spectune.operator.tuning import exploration_lease, saved_state, tune
from spectune.operator.tuning import observe as observe_turn

from .machine import H100, L4, T0, curve, fresh, observe, spec, window

LEASE = 60.0


def pod(name: str, ip: str = "127.0.0.5", ready: bool = True) -> dict:
    state = "True" if ready else "False"
    return {
        "metadata": {"name": name},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": state}]},
    }


PODS = [pod("e-0", "127.0.0.5"), pod("e-1", "127.0.0.6")]
ROLLOUT = {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2}


def status_of(state: autotune.State) -> dict:
    return {
        "threshold": state.threshold.model_dump(),
        "perSku": [s.model_dump(exclude_none=True) for s in state.per_sku],
        "calibration": state.calibration.model_dump(exclude_none=True),
    }


def test_a_started_calibration_raises_exploration_only_as_a_lease() -> None:
    s = spec()
    t = tune("llm", s, {}, 3, PODS, ROLLOUT, observe(0, window()), LEASE)
    assert [e.reason for e in t.events] == ["CalibrationStarted"]
    assert t.status["calibration"]["phase"] == "Exploring" and t.status["observedGeneration"] == 3
    speculation = t.config["speculation"]
    assert speculation["exploration"] == 0.02  # the base share stays what the spec says
    assert "lease" not in speculation  # the lease goes out by the admin API alone
    lease = t.engines[0].lease
    assert lease is not None
    assert lease["exploration"] == autotune.CALIBRATION_EXPLORATION_PERCENT / 100
    assert LEASE <= lease["until"] - T0.timestamp() <= 1.5 * LEASE
    assert [(e.pod, e.url, e.exploration, e.lease) for e in t.engines] == [
        ("e-0", "http://127.0.0.5:8000", 0.02, lease),
        ("e-1", "http://127.0.0.6:8000", 0.02, lease),
    ]
    assert render.engine_config(s, 4, 2)["speculation"] == speculation
    assert lease["below"] is None  # the first calibration explores every batch


def test_a_shifts_calibration_bounds_the_lease_it_sends() -> None:
    """The batch range a traffic shift's calibration explores reaches the engines in the
    lease, with the status that explains it."""
    state = tune("llm", spec(), {}, 1, PODS, ROLLOUT, observe(0, window()), LEASE).state
    bounded = dataclasses.replace(
        state, calibration=state.calibration.model_copy(update={"exploreBelow": 48})
    )
    lease = exploration_lease(bounded, T0, LEASE)
    assert lease is not None and lease["below"] == 48
    status = {"calibration": bounded.calibration.model_dump(exclude_none=True)}
    t = tune("llm", spec(), status, 1, PODS, ROLLOUT, observe(10, window()), LEASE)
    assert {e.lease["below"] for e in t.engines if e.lease} == {48}


def test_a_pod_that_joins_mid_calibration_explores_only_once_it_is_scraped() -> None:
    """A pod ready while a calibration explores gets the base share, not the lease, until
    Prometheus holds its series: its steps could not be measured, and exploring costs (issue
    59, F: a new pod ran at 0.5 while MetricsAvailable said EnginesNotScraped). Nor does the
    ConfigMap, which a new pod reads at start, carry the lease."""
    s = spec()
    state = tune("llm", s, {}, 1, PODS, ROLLOUT, observe(0, window()), LEASE).state
    assert state.calibration.phase == "Exploring"
    pods = [*PODS, pod("e-2", "127.0.0.7")]
    rollout = {"replicas": 3, "readyReplicas": 3, "updatedReplicas": 3}
    status = {"calibration": state.calibration.model_dump(exclude_none=True)}
    t = tune("llm", s, status, 1, pods, rollout, observe(10, window(), replicas=3), LEASE)
    assert t.state.calibration.phase == "Exploring"
    leased = {e.pod: e.lease is not None for e in t.engines}
    assert leased == {"e-0": True, "e-1": True, "e-2": False}
    assert "lease" not in t.config["speculation"]
    scraped = window(pods={"e-0": H100, "e-1": H100, "e-2": H100})
    t = tune("llm", s, status, 1, pods, rollout, observe(20, scraped, replicas=3), LEASE)
    assert all(e.lease is not None for e in t.engines)


def test_the_lease_changes_once_a_half_lease_and_never_while_idle() -> None:
    exploring = tune("llm", spec(), {}, 1, PODS, ROLLOUT, observe(0, window()), LEASE).state
    untils = {
        exploration_lease(exploring, T0 + timedelta(seconds=t), LEASE)["until"]  # type: ignore[index]
        for t in range(0, 120, 10)
    }
    assert len(untils) == 5  # 12 turns 10 s apart: renewed once every 30 s, not every turn
    assert exploration_lease(fresh(spec()), T0, LEASE) is None


def test_unready_pods_and_pods_without_an_ip_are_not_pushed() -> None:
    pods = [*PODS, pod("e-2", ready=False), {"metadata": {"name": "e-3"}, "status": {}}]
    t = tune("llm", spec(), {}, 1, pods, ROLLOUT, observe(0, window()), LEASE)
    assert [e.pod for e in t.engines] == ["e-0", "e-1"]


def test_every_engine_gets_each_skus_threshold_and_manual_one_for_all() -> None:
    """Measured per SKU, the ConfigMap and every push carry the map, and each engine runs its
    own SKU's entry (an engine that is neither runs the deployment's); Manual pins one value
    on every pod (issue 59, D and M: the operator never decides a pod's SKU, so a pod whose SKU
    it could not see, Prometheus down after a restart, never gets another SKU's threshold)."""
    auto = spec()
    pods = {"e-0": H100, "e-1": L4}
    state = autotune.step(auto, fresh(auto), observe(0, window(pods=pods))).state
    both = window({H100: curve(12), L4: curve(32)}, pods=pods)
    state = autotune.step(auto, state, observe(30, both)).state
    measured = tune("llm", auto, status_of(state), 1, PODS, ROLLOUT, observe(40, both), LEASE)
    assert measured.config["speculation"]["thresholds"] == {H100: 12, L4: 32}
    assert {e.pod: (e.threshold_on(H100), e.threshold_on(L4)) for e in measured.engines} == {
        "e-0": (12, 32),
        "e-1": (12, 32),
    }
    restarted = tune("llm", auto, status_of(state), 1, PODS, ROLLOUT, observe(50, None), LEASE)
    assert [e.thresholds for e in restarted.engines] == [{H100: 12, L4: 32}] * 2
    assert restarted.engines[0].threshold_on("NVIDIA-A100-SXM4-40GB") == 32  # the majority's
    manual = spec("Manual", 6)
    saved = status_of(saved_state(manual, status_of(state)))
    pinned = tune("llm", manual, saved, 2, PODS, ROLLOUT, observe(50, None), LEASE)
    assert {e.pod: e.threshold_on(L4) for e in pinned.engines} == {"e-0": 6, "e-1": 6}
    assert pinned.config["speculation"]["threshold"] == 6
    assert pinned.config["speculation"]["thresholds"] == {}


def test_auto_without_a_start_value_tells_the_engines_8_until_a_measurement() -> None:
    """The first turn of an Auto deployment that gives no value: the ConfigMap and every
    engine get 8 and the status says where it came from; Advisory tells them nothing new."""
    t = tune("llm", spec(value=None), {}, 1, PODS, ROLLOUT, observe(0, window()), LEASE)
    assert t.config["speculation"]["threshold"] == 8
    assert [e.threshold for e in t.engines] == [8, 8]
    assert (t.status["threshold"]["current"], t.status["threshold"]["source"]) == (8, "Default")
    advisory = spec("Advisory", None)
    t = tune("llm", advisory, {}, 1, PODS, ROLLOUT, observe(0, window()), LEASE)
    assert t.config["speculation"]["threshold"] is None
    assert [e.threshold for e in t.engines] == [None, None]


def test_prometheus_down_is_reported_in_the_committed_conditions() -> None:
    t = tune("llm", spec(), {}, 1, PODS, ROLLOUT, observe(0, None, error="refused"), LEASE)
    degraded = next(c for c in t.status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "PrometheusUnavailable"


def ready_since(name: str, ip: str, seconds_before_t0: float) -> dict:
    p = pod(name, ip)
    since = T0 - timedelta(seconds=seconds_before_t0)
    p["status"]["conditions"][0]["lastTransitionTime"] = since.isoformat().replace("+00:00", "Z")
    return p


def metrics_condition(t) -> dict:
    return next(c for c in t.status["conditions"] if c["type"] == "MetricsAvailable")


def test_no_exploration_while_a_ready_engine_has_no_series_and_the_condition_says_why() -> None:
    """The usual fresh install: a PodMonitor nobody selects. Nothing explores, the condition
    names the pod and the selector queried within one turn, and one Event says so."""
    s = spec()
    pods = [ready_since("e-0", "127.0.0.5", 600), ready_since("e-1", "127.0.0.6", 600)]
    only_e0 = window(pods={"e-0": H100})
    obs = observe(0, only_e0, selector='{namespace="ns"}')
    t = tune("llm", s, {}, 1, pods, ROLLOUT, obs, LEASE)
    assert t.state.calibration.phase == "Idle" and "lease" not in t.config["speculation"]
    assert all(e.lease is None for e in t.engines)
    c = metrics_condition(t)
    assert (c["status"], c["reason"]) == ("False", "EnginesNotScraped")
    assert "e-1" in c["message"] and '{namespace="ns"}' in c["message"]
    assert [(e.reason, e.warning) for e in t.events] == [("EnginesNotScraped", True)]
    again = tune("llm", s, t.status, 1, pods, ROLLOUT, observe(10, only_e0), LEASE)
    assert again.events == () and metrics_condition(again)["status"] == "False"  # one Event
    both = tune("llm", s, again.status, 1, pods, ROLLOUT, observe(20, window()), LEASE)
    assert [e.reason for e in both.events] == ["CalibrationStarted"]
    assert metrics_condition(both)["status"] == "True"


def test_an_engine_still_warming_up_holds_the_start_without_a_warning() -> None:
    s = spec()
    pods = [ready_since("e-0", "127.0.0.5", 600), ready_since("e-1", "127.0.0.6", 5)]
    t = tune("llm", s, {}, 1, pods, ROLLOUT, observe(0, window(pods={"e-0": H100})), LEASE)
    assert t.state.calibration.phase == "Idle" and t.events == ()
    assert metrics_condition(t)["status"] == "True"


def test_a_turn_reads_since_the_last_pod_became_ready_and_a_read_error_is_an_observation() -> None:
    s = spec()
    since = [T0 - timedelta(seconds=200), T0 - timedelta(seconds=40)]
    pods = [
        pod(f"e-{i}") | {"status": {"podIP": "127.0.0.5", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": t.isoformat()}]}}
        for i, t in enumerate(since)
    ]  # fmt: skip
    asked: list[int] = []

    def read(seconds: int) -> FleetWindow:
        asked.append(seconds)
        return window()

    seen = observe_turn(s, fresh(s), pods, T0, read, (), "{}")
    assert seen.ready_at == since[1] and seen.settled and asked == [40]

    def down(seconds: int) -> FleetWindow:
        raise MetricsUnavailable("connection refused")

    failed = observe_turn(s, fresh(s), pods, T0, down, (), "{}")
    assert failed.window is None and failed.error == "connection refused"


def test_a_window_holding_too_few_scrapes_is_refused_with_the_reason() -> None:
    """The 30 s scrape interval most clusters use and a 60 s calibration window: two scrapes
    a window, too few to compare two modes per bucket; nothing explores, the condition says
    how long the window must be."""
    s = spec()  # calibrationWindowSeconds 60
    slow = window(interval=30.0)
    t = tune("llm", s, {}, 1, PODS, ROLLOUT, observe(0, slow), LEASE)
    assert t.state.calibration.phase == "Idle" and all(e.lease is None for e in t.engines)
    c = metrics_condition(t)
    assert (c["status"], c["reason"]) == ("False", "CalibrationWindowTooShort")
    assert "holds 2.0 scrapes at the 30 s scrape interval" in c["message"]
    assert "240 s or more" in c["message"]
    assert [e.reason for e in t.events] == ["CalibrationWindowTooShort"]
    longer = spec(calibrationWindowSeconds=240)
    ok = tune("llm", longer, t.status, 2, PODS, ROLLOUT, observe(10, slow), LEASE)
    # scrapes a little late (the median gap of a busy machine's Prometheus): the same words,
    # and the 240 s they ask for is not refused for the jitter
    late = tune("llm", s, {}, 1, PODS, ROLLOUT, observe(0, window(interval=30.011)), LEASE)
    assert "holds 2.0 scrapes at the 30 s scrape interval" in metrics_condition(late)["message"]
    assert "240 s or more" in metrics_condition(late)["message"]
    assert autotune.window_too_short(longer, 30.011) is None
    assert [e.reason for e in ok.events] == ["CalibrationStarted"]
    assert metrics_condition(ok)["status"] == "True"


def test_a_window_left_unset_follows_the_scrape_interval_and_status_shows_it() -> None:
    """No window in the spec, scrapes every 30 s: the turn reads and judges 8 scrapes (240 s),
    calibrates, and status says 240; where the scrapes come every 5 s, 120."""
    unset = spec()
    unset = unset.model_copy(
        update={"tuning": unset.tuning.model_copy(update={"calibrationWindowSeconds": None})}
    )
    slow = window(interval=30.0)
    t = tune("llm", unset, {}, 1, PODS, ROLLOUT, observe(0, slow), LEASE, interval=30.0)
    assert t.status["calibrationWindowSeconds"] == 240
    assert metrics_condition(t)["status"] == "True"
    assert [e.reason for e in t.events] == ["CalibrationStarted"]
    asked: list[int] = []

    def read(seconds: int) -> FleetWindow:
        asked.append(seconds)
        return slow

    observe_turn(unset, fresh(unset), PODS, T0, read, (), "{}", 30.0)
    assert asked == [240]  # idle: one calibration window back
    fast = tune("llm", unset, {}, 1, PODS, ROLLOUT, observe(0, window()), LEASE, interval=5.0)
    assert fast.status["calibrationWindowSeconds"] == 120


def test_nothing_explores_before_a_second_scrape_shows_the_interval() -> None:
    """An engine counts as scraped once its first sample is old enough, and until a second
    the scrape interval is unknown, so is whether the window holds enough scrapes: no
    calibration starts. (The kube-prometheus-stack e2e saw one start at 30 s scrapes on the
    first, then the window refused: `tests/chart/test_prometheus_operator.py`.)"""
    s = spec()
    first = tune("llm", s, {}, 1, PODS, ROLLOUT, observe(0, window(interval=None)), LEASE)
    assert first.state.calibration.phase == "Idle" and all(e.lease is None for e in first.engines)
    assert first.events == ()
    second = tune("llm", s, {}, 1, PODS, ROLLOUT, observe(0, window(interval=5.0)), LEASE)
    assert [e.reason for e in second.events] == ["CalibrationStarted"]


def test_the_targets_are_asked_why_only_for_pods_overdue_and_the_condition_names_the_cause() -> (
    None
):
    """A pod still inside the grace is not diagnosed (it may be about to be scraped); one past
    it is, and the condition carries the cause. A failed targets call says less, no more."""
    s = spec()
    pods = [ready_since("e-0", "127.0.0.5", 600), ready_since("e-1", "127.0.0.6", 600),
            ready_since("e-2", "127.0.0.7", 5)]  # fmt: skip
    asked: list[list[str]] = []

    def diagnose(late: list[str]) -> dict[str, str]:
        asked.append(late)
        return {pod: "Prometheus has no target for it" for pod in late}

    only_e0 = window(pods={"e-0": H100})
    seen = observe_turn(s, fresh(s), pods, T0, lambda _: only_e0, (), "{}", diagnose=diagnose)
    assert asked == [["e-1"]]
    assert seen.scrape_problems == {"e-1": "Prometheus has no target for it"}
    c = metrics_condition(tune("llm", s, {}, 1, pods, ROLLOUT, seen, LEASE))
    assert c["reason"] == "EnginesNotScraped"
    assert c["message"].endswith("until they are scraped; e-1: Prometheus has no target for it")
    assert observe_turn(s, fresh(s), pods[:1], T0, lambda _: only_e0, (), "{}", diagnose=diagnose)
    assert len(asked) == 1  # every ready pod scraped: nothing to ask

    def unavailable(late: list[str]) -> dict[str, str]:
        raise MetricsUnavailable("/api/v1/targets: 503")

    quiet = observe_turn(s, fresh(s), pods, T0, lambda _: only_e0, (), "{}", diagnose=unavailable)
    assert quiet.scrape_problems == {} and quiet.window is only_e0
    general = metrics_condition(tune("llm", s, {}, 1, pods, ROLLOUT, quiet, LEASE))
    assert "check that a PodMonitor or scrape config selects these pods" in general["message"]


def verifying_state() -> tuple[autotune.State, float]:
    """A threshold just moved (4 -> 12) and under verification; the second: when it moved."""
    s = spec()
    state = autotune.step(s, fresh(s), observe(0, window())).state
    moved = autotune.step(s, state, observe(60, window({H100: curve(12)})))
    assert moved.state.calibration.phase == "Verifying", moved.events
    return moved.state, 60.0


def test_a_read_that_raises_anything_is_a_turn_without_a_window() -> None:
    """Not only MetricsUnavailable: whatever a read raises, the turn goes on without a window
    and says so (issue 59, H)."""

    def broken(seconds: int) -> FleetWindow:
        raise ValueError("cannot convert float NaN to integer")

    seen = observe_turn(spec(), fresh(spec()), PODS, T0, broken, [], "{}", 5.0)
    assert seen.window is None and seen.error_reason == "MetricsReadFailed"
    assert "NaN" in (seen.error or "")
    t = tune("llm", spec(), {}, 1, PODS, ROLLOUT, seen, LEASE)
    degraded = next(c for c in t.status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "MetricsReadFailed")


def test_a_decision_that_raises_still_rolls_back_at_the_verification_deadline(
    monkeypatch,
) -> None:
    """A window no test foresaw makes the decision raise in every turn: the turn still commits,
    Degraded says why, and a change under verification is rolled back at its deadline rather
    than kept unverified forever (issue 59, H)."""
    state, changed = verifying_state()

    def raises(*_a, **_k):
        raise RuntimeError("an unforeseen window")

    monkeypatch.setattr(autotune, "_verify", raises)
    status = status_of(state)
    deadline = changed + autotune.VERIFY_WINDOWS * 60
    for at in range(int(changed) + 10, int(deadline) + 20, 10):
        t = tune("llm", spec(), status, 1, PODS, ROLLOUT, observe(at, window()), LEASE)
        status = {**status, **t.status}
        degraded = next(c for c in t.status["conditions"] if c["type"] == "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "DecisionFailed")
        if t.state.calibration.phase == "Idle":
            break
    assert at >= deadline and [e.reason for e in t.events] == ["RolledBack"]
    assert t.state.threshold.current == 4


def test_children_the_api_server_refused_degrade_the_deployment_with_the_reason() -> None:
    """Issue 59, K: a failed apply was a log line only."""
    for reason in ("ApplyFailed", "NotOwned"):
        why = Refusal(reason, "Deployment llm: exceeded quota")
        t = tune("llm", spec(), {}, 1, PODS, ROLLOUT, observe(0, window()), LEASE, why)
        degraded = next(c for c in t.status["conditions"] if c["type"] == "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", reason)
        assert why.message in degraded["message"]
        assert len(t.engines) == 2  # the engines are told all the same
