"""The autotuner when things fail, end to end: the operator killed while engines explore, then
the Prometheus it reads stopped mid-calibration and started again; and the modes it must not
act in (Advisory recommends only, Manual is never touched).

The Prometheus here is a second real one with the local cluster's scrape configuration, so that
stopping it leaves the cluster's own to every other test. Traffic is bounded and goes to
loopback pod IPs only.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.cluster.support import LOCAL, Cluster, wait_until

from .conftest import RULES, create, delete_specdeployments, get_sd, start_operator, stop
from .test_autotune_cluster import START, Load, auto_sd, events, speculation, urls
from .test_operator_cluster import all_ready, sd_condition

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

BASE_EXPLORATION = 0.02  # tuning.explorationPercent's default, as a share
PRIORITY = 171


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OwnPrometheus:
    """A real Prometheus scraping the cluster's pods, which a test may stop and start again."""

    def __init__(self, tmp: Path) -> None:
        self.data, self.port = tmp / "data", free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.log = tmp / "prometheus.log"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                str(LOCAL / "bin" / "prometheus"),
                "--config.file", str(LOCAL / "state" / "prometheus" / "prometheus.yml"),
                "--storage.tsdb.path", str(self.data),
                "--web.listen-address", f"127.0.0.1:{self.port}",
                "--log.level", "warn",
            ],
            stdout=self.log.open("a"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        wait_until("our Prometheus ready", lambda: opener.open(f"{self.url}/-/ready", timeout=2))

    def stop(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(30)


class Operator:
    """An operator watching one namespace, reading `prometheus_url`; `kill` is SIGKILL."""

    def __init__(
        self, cluster: Cluster, admin: client.ApiClient, tmp: Path, namespace: str, url: str
    ) -> None:
        self.peering = f"failures-{uuid.uuid4().hex[:6]}"
        self.args = (cluster, admin, tmp, yaml.safe_load(RULES.read_text()))
        self.extra = ["--namespace", namespace, "--peering", self.peering,
                      "--prometheus-url", url]  # fmt: skip
        self.logs: list[Path] = []
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process, log = start_operator(*self.args, priority=PRIORITY, extra=self.extra)
        self.logs.append(log)

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory) -> Iterator[OwnPrometheus]:
    own = OwnPrometheus(tmp_path_factory.mktemp("prometheus"))
    own.start()
    yield own
    if own.process and own.process.poll() is None:
        own.stop()


@pytest.fixture(scope="module")
def watched(
    cluster: Cluster, admin: client.ApiClient, prometheus: OwnPrometheus, tmp_path_factory
) -> Iterator[tuple[str, Operator]]:
    namespace = f"failures-{uuid.uuid4().hex[:8]}"
    core, custom = client.CoreV1Api(admin), client.CustomObjectsApi(admin)
    core.create_namespace({"metadata": {"name": namespace}})
    operator = Operator(cluster, admin, tmp_path_factory.mktemp("op"), namespace, prometheus.url)
    operator.start()  # it makes its peering
    yield namespace, operator
    try:
        delete_specdeployments(admin, namespace)
    finally:
        if operator.process is not None:
            stop(operator.process)
    for log in operator.logs:
        print(f"--- {log.name}\n{log.read_text()[-2500:]}")
    core.delete_namespace(namespace)
    custom.delete_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", operator.peering)


def calibration_phase(admin: client.ApiClient, namespace: str, name: str) -> str | None:
    return ((get_sd(admin, namespace, name).get("status") or {}).get("calibration") or {}).get(
        "phase"
    )


def exploring(url: str) -> bool | None:
    return speculation(url)["exploration"] > 0.2 or None


def at_base(url: str) -> bool | None:
    return speculation(url)["exploration"] == pytest.approx(BASE_EXPLORATION) or None


def test_a_killed_operator_and_a_stopped_prometheus_leave_no_engine_exploring(
    admin: client.ApiClient, prometheus: OwnPrometheus, watched: tuple[str, Operator]
) -> None:
    namespace, operator = watched
    name = "resilient"
    body = auto_sd(name)
    body["spec"]["tuning"]["maxAgeSeconds"] = 60  # re-measures a minute after each measurement
    create(admin, namespace, body)
    pods = wait_until("1 ready engine", lambda: all_ready(admin, namespace, name, 1), timeout=120)
    (url,) = urls(pods)
    with Load([url], seconds=420) as load:
        # the operator raises exploration on the engines before it writes the phase to status
        # (kopf patches status after the handler): the engine alone may explore for a moment
        def calibrating() -> bool | None:
            phase = calibration_phase(admin, namespace, name)
            return (exploring(url) and phase == "Exploring") or None

        wait_until("exploration raised, and Exploring in status", calibrating, timeout=90)

        # SIGKILL mid-calibration: the phase lives in status, so the next operator resumes it
        operator.kill()
        try:
            phase = calibration_phase(admin, namespace, name)
        finally:
            operator.start()  # the module's next test needs it whatever happened here
        assert phase == "Exploring", phase
        wait_until(
            "the restarted operator finishing the calibration",
            lambda: calibration_phase(admin, namespace, name) in ("Verifying", "Idle") or None,
            timeout=120,
        )
        assert sd_condition(admin, namespace, name, "Calibrated")["status"] == "True"
        wait_until("exploration back at its base after the restart", lambda: at_base(url), 30)

        # Prometheus stopped while the next calibration (the measurement's maximum age) explores:
        # Degraded, the threshold kept, exploration lowered on the engine
        threshold = speculation(url)["threshold"]
        wait_until("exploring again", lambda: exploring(url), timeout=150)
        prometheus.stop()
        degraded = wait_until(
            "Degraded=True (Prometheus unavailable)",
            lambda: (
                (c := sd_condition(admin, namespace, name, "Degraded")).get("status") == "True"
                and c
            ),
            timeout=60,
        )
        assert degraded["reason"] == "PrometheusUnavailable", degraded
        wait_until("exploration lowered without Prometheus", lambda: at_base(url), 30)
        assert speculation(url)["threshold"] == threshold
        status = get_sd(admin, namespace, name)["status"]
        assert status["threshold"]["current"] == threshold
        assert "CalibrationAborted" in [e.reason for e in events(admin, namespace, name)]

        # Prometheus back: recovers by itself and calibrates again
        prometheus.start()
        wait_until(
            "Degraded=False again",
            lambda: sd_condition(admin, namespace, name, "Degraded").get("status") == "False",
            timeout=60,
        )
        recalibrated = wait_until(
            "a calibration completed after Prometheus came back",
            lambda: _finished_after(admin, namespace, name, degraded["lastTransitionTime"]),
            timeout=180,
        )
        print(f"\nrecovered: {recalibrated}")
        wait_until("exploration at its base", lambda: at_base(url), 30)
    assert load.sent > 0 and load.failed < load.sent / 10, (load.sent, load.failed)


def _finished_after(
    admin: client.ApiClient, namespace: str, name: str, since: str
) -> dict[str, Any] | None:
    """The calibration status once a calibration started after `since` left Exploring."""
    cal = (get_sd(admin, namespace, name).get("status") or {}).get("calibration") or {}
    started = cal.get("startedAt")
    done = cal.get("phase") in ("Verifying", "Idle") and started and _t(started) > _t(since)
    return cal if done else None


def _t(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def test_advisory_recommends_without_touching_engines_and_manual_is_left_alone(
    admin: client.ApiClient, watched: tuple[str, Operator]
) -> None:
    namespace, _ = watched
    advisory, manual = auto_sd("advisory"), auto_sd("manual")
    advisory["spec"]["speculation"]["threshold"]["mode"] = "Advisory"
    manual["spec"]["speculation"]["threshold"] = {"mode": "Manual", "value": 6}
    for body in (advisory, manual):
        create(admin, namespace, body)
    ready = {
        n: wait_until(f"{n} ready", lambda n=n: all_ready(admin, namespace, n, 1), timeout=120)
        for n in ("advisory", "manual")
    }
    (advisory_url,), (manual_url,) = urls(ready["advisory"]), urls(ready["manual"])
    with Load([advisory_url, manual_url]) as load:
        wait_until("the Advisory engine exploring", lambda: exploring(advisory_url), timeout=90)
        assert at_base(manual_url)  # no calibration reaches a Manual deployment
        recommended = wait_until(
            "a recommendation",
            lambda: (
                (c := sd_condition(admin, namespace, "advisory", "Calibrated")).get("reason")
                == "Recommended"
                and c
            ),
            timeout=150,
        )
        assert recommended["status"] == "True"
        status = get_sd(admin, namespace, "advisory")["status"]
        assert status["threshold"]["current"] == START
        assert status["threshold"]["recommended"] is not None
        assert status["threshold"]["source"] != "Measured"
        reasons = [e.reason for e in events(admin, namespace, "advisory")]
        assert "ThresholdRecommended" in reasons and "ThresholdChanged" not in reasons
        wait_until("Advisory exploration back at its base", lambda: at_base(advisory_url), 30)
        assert speculation(advisory_url)["threshold"] == START
    live = speculation(manual_url)
    assert live["threshold"] == 6 and live["exploration"] == pytest.approx(BASE_EXPLORATION)
    manual_status = get_sd(admin, namespace, "manual")["status"]
    assert manual_status["threshold"]["current"] == 6
    assert not {"CalibrationStarted", "ThresholdChanged"} & {
        e.reason for e in events(admin, namespace, "manual")
    }
    assert load.sent > 0 and load.failed < load.sent / 10, (load.sent, load.failed)
