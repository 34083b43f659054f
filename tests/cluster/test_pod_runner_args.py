"""The pod runner's decisions, without a cluster: how a pod's container becomes an engine
command line (the runner, not the pod, decides the address an engine binds, and mounted files
must resolve), and what the pod's status says about the engine's readiness."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.support import load_script

runner = load_script("pod_runner")


def test_host_and_port_from_the_pod_are_dropped() -> None:
    argv = [
        "spectune-engine",
        "serve",
        "--model",
        "m",
        "--host",
        "0.0.0.0",
        "--port=80",
        "--k",
        "4",
    ]
    assert runner.strip_flags(argv) == ["--model", "m", "--k", "4"]
    assert runner.strip_flags(["--port", "1", "--method", "ngram"]) == ["--method", "ngram"]


def test_paths_under_mounts_point_at_the_runners_files() -> None:
    mounts = {"/etc/spectune": Path("/s/cfg"), "/etc/spectune/admin": Path("/s/tok")}
    argv = ["--config", "/etc/spectune/engine.yaml", "--admin-token-file=/etc/spectune/admin/t",
            "--model", "/etc/spectunex/m"]  # fmt: skip
    assert runner.rewrite_paths(argv, mounts) == [
        "--config", "/s/cfg/engine.yaml", "--admin-token-file=/s/tok/t",
        "--model", "/etc/spectunex/m",
    ]  # fmt: skip


Readiness = runner.Readiness
NOT_READY = Readiness(False, "EngineNotReady", "engine not ready: GET /readyz answered 503")


def test_readiness_follows_the_probe_as_a_kubelet_would() -> None:
    assert runner.judge(None, NOT_READY, 0, "") == Readiness(True)
    assert runner.judge("GET /readyz answered 503", Readiness(False), 1, "") == NOT_READY
    # A ready engine survives a slow answer or two, not FAILURE_THRESHOLD of them.
    limit = runner.FAILURE_THRESHOLD
    assert runner.judge("timed out", Readiness(True), limit - 1, "") == Readiness(True)
    assert not runner.judge("timed out", Readiness(True), limit, "").ready
    # After an exit, the exit is the reason until the engine is ready again.
    exit_ = "engine exited with code 1: ModelNotFound: /models/none"
    assert runner.judge("refused", Readiness(False), 1, exit_) == Readiness(
        False, "EngineExited", exit_
    )


def test_last_line_is_the_error_an_engine_died_of() -> None:
    assert runner.last_line("loading\nValueError: no such model\n\n") == "ValueError: no such model"
    assert runner.last_line("") == ""


STATUS = {
    "phase": "Running",
    "conditions": [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "t0"},
        {"type": "Ready", "status": "False", "reason": "ContainersNotReady", "message": "m",
         "lastTransitionTime": "t0"},
        {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady",
         "message": "m", "lastTransitionTime": "t0"},
    ],
    "containerStatuses": [
        {"name": "sidecar", "ready": True, "restartCount": 0, "state": {"running": {}}},
        {"name": "engine", "ready": False, "restartCount": 0, "image": "i",
         "state": {"running": {"startedAt": "t0"}}},
    ],
}  # fmt: skip
RUNNING = {"running": {"startedAt": "t1"}}


def apply(status: dict, patch: dict) -> dict:
    """What the API server makes of the strategic merge patch (conditions merge by type)."""
    conditions = {c["type"]: c for c in status["conditions"]}
    for c in patch["status"]["conditions"]:
        conditions[c["type"]] = {k: v for k, v in c.items() if v is not None}
    return status | {
        "conditions": list(conditions.values()),
        "containerStatuses": patch["status"]["containerStatuses"],
    }


def test_status_patch_makes_the_pod_ready_and_then_has_nothing_to_do() -> None:
    patch = runner.status_patch(STATUS, "engine", Readiness(True), 0, RUNNING, "t1")
    assert patch is not None
    conditions = {c["type"]: c for c in patch["status"]["conditions"]}
    assert set(conditions) == {"Ready", "ContainersReady"}
    assert conditions["Ready"] == {"type": "Ready", "status": "True", "reason": None,
                                   "message": None, "lastTransitionTime": "t1"}  # fmt: skip
    statuses = {c["name"]: c for c in patch["status"]["containerStatuses"]}
    assert statuses["sidecar"] == STATUS["containerStatuses"][0]  # the list is replaced whole
    assert statuses["engine"]["ready"] is True and statuses["engine"]["image"] == "i"
    assert statuses["engine"]["state"] == RUNNING
    after = apply(STATUS, patch)
    assert runner.status_patch(after, "engine", Readiness(True), 0, RUNNING, "t2") is None


def test_status_patch_says_why_and_keeps_the_transition_time_while_the_status_holds() -> None:
    crashed = Readiness(False, "EngineExited", "engine exited with code 1: boom")
    waiting = {"waiting": {"reason": "CrashLoopBackOff", "message": crashed.message}}
    patch = runner.status_patch(STATUS, "engine", crashed, 2, waiting, "t5")
    assert patch is not None
    ready = next(c for c in patch["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "EngineExited"
    assert ready["message"] == crashed.message and ready["lastTransitionTime"] == "t0"
    engine = patch["status"]["containerStatuses"][-1]
    assert engine["restartCount"] == 2 and engine["state"] == waiting
    assert runner.status_patch(apply(STATUS, patch), "engine", crashed, 2, waiting, "t6") is None


def test_a_gpu_node_runs_its_engine_on_the_simulated_sku() -> None:
    assert runner.simulated_env("NVIDIA-L4", 8.0) == {
        "SPECTUNE_SIMULATE_DEVICE": "NVIDIA-L4",
        "SPECTUNE_SIMULATE_TIME_SCALE": "8",
    }
    assert runner.simulated_env(None, 8.0) == {}  # a node without a GPU: the CPU's own clock


@pytest.mark.parametrize(
    "annotation", ["spectune.io/simulate-time-scale", "spectune.io/simulate-context-scale"]
)
def test_a_pod_may_set_its_own_time_and_context_scale(annotation: str) -> None:
    assert runner.scale_of(annotation, 16.0, None) == 16.0
    assert runner.scale_of(annotation, 16.0, {annotation: "4"}) == 4.0
    for bad in ("0", "-2", "fast"):
        with pytest.raises(runner.SkipPod, match="not a positive number"):
            runner.scale_of(annotation, 16.0, {annotation: bad})
    assert runner.simulated_env("NVIDIA-L4", 8.0, 4.0)["SPECTUNE_SIMULATE_CONTEXT_SCALE"] == "4"


def test_pod_runner_simulates_a_pod_that_opts_in() -> None:
    assert runner.wants_simulation(False, {"spectune.io/simulate-gpu": "true"})
    assert not runner.wants_simulation(False, {"spectune.io/simulate-gpu": "false"})
    assert not runner.wants_simulation(False, None)
    assert runner.wants_simulation(True, None)
