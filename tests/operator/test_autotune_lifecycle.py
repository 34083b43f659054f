"""Auto end to end through what happens to a fleet, on one deployment calibrated once: the
operator (its own ServiceAccount, the chart's RBAC) reads a real Prometheus, raises exploration
on the real engines behind the pods, measures the crossover from their live traffic and moves
every engine's threshold there through the admin API and the ConfigMap; then the replicas
change, the operator is killed mid-calibration, the pods move to another GPU SKU, and the
Prometheus it reads stops mid-calibration and starts again. Beside its first calibration, on
deployments of their own, the modes it must not act in (Advisory recommends only, Manual is
never touched).

The tests share the deployment and its load, in this order: each starts from "calibrated, no
calibration running" (the `calibrated` fixture) and says what it leaves. The Prometheus here is
a second real one with the local cluster's scrape configuration, so that stopping it leaves the
cluster's own to every other test. The pods ask for simulated GPUs (podAnnotations:
spectune.io/simulate-gpu). Traffic is bounded (clients, requests and time) and goes to loopback
pod IPs only."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from spectune.engine import contract
from spectune.operator import render
from spectune.operator.damping import bucket_steps
from spectune.operator.launch import OperatorProcess
from spectune.operator.models import GROUP, PLURAL, VERSION
from tests.cluster.support import LOCAL, Cluster
from tests.support.ports import free_port
from tests.support.waiting import wait_until

from .e2e import Load, calibration_started, events, simulated, speculation, unix_time, urls
from .support import (
    A100,
    AUTO,
    H100,
    RULES,
    START,
    all_ready,
    create,
    delete_specdeployments,
    get_sd,
    patch_sd,
    sd_condition,
    specdeployment,
    start_operator,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

BASE_EXPLORATION = 0.02  # tuning.explorationPercent's default, as a share
LEASE = 20.0  # --exploration-lease: short, so that the killed operator's runs out in the test
INSTANCE = 171
NAME = "tuned"
# the shared deployment's load: the module's tests take some 15 minutes at most
FLEET_SECONDS, FLEET_REQUESTS = 1500, 20000
# its calibration windows: each of its six calibrations explores and is verified within one
FLEET_WINDOW = 20


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
    """An operator watching one namespace, reading `prometheus_url`, that a test may kill
    (SIGKILL) and start again."""

    def __init__(
        self, cluster: Cluster, admin: client.ApiClient, tmp: Path, namespace: str, url: str
    ) -> None:
        self.args = (cluster, admin, tmp, yaml.safe_load(RULES.read_text()))
        self.extra = ["--namespace", namespace,
                      "--prometheus-url", url, "--exploration-lease", str(LEASE)]  # fmt: skip
        self.runs: list[OperatorProcess] = []

    def start(self) -> None:
        self.runs.append(start_operator(*self.args, instance=INSTANCE, extra=self.extra))

    def kill(self) -> None:
        self.runs[-1].kill()


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
    namespace = f"lifecycle-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(admin)
    core.create_namespace({"metadata": {"name": namespace}})
    operator = Operator(cluster, admin, tmp_path_factory.mktemp("op"), namespace, prometheus.url)
    operator.start()
    yield namespace, operator
    try:
        delete_specdeployments(admin, namespace)
    finally:
        operator.runs[-1].stop()
    for run in operator.runs:
        print(f"--- {run.log.name}\n{run.log.read_text()[-2500:]}")
    core.delete_namespace(namespace)


@dataclass
class Fleet:
    """The shared Auto deployment and the load on its engines."""

    namespace: str
    operator: Operator
    load: Load
    pods: list[Any] = field(default_factory=list)

    @property
    def url(self) -> str:
        (url,) = urls(self.pods)
        return url


@pytest.fixture(scope="module")
def fleet(admin: client.ApiClient, watched: tuple[str, Operator]) -> Iterator[Fleet]:
    """One Auto deployment (one engine on a simulated H100, start threshold START, 20 s
    calibration windows) under eight closed-loop clients for the rest of the module. Its node
    has GPUs to spare, so it rolls with a surge pod: a k change replaces its one engine, and
    GPU engines' default (one at a time, no surge, for full pools: test_rollout.py) would
    leave the load a minute without an engine."""
    namespace, operator = watched
    body = specdeployment(NAME, AUTO)
    body["spec"]["tuning"]["calibrationWindowSeconds"] = FLEET_WINDOW
    body["spec"]["engine"]["strategy"] = {"maxSurge": 1, "maxUnavailable": 0}
    create(admin, namespace, body)
    pods = wait_until("1 ready engine", lambda: all_ready(admin, namespace, NAME, 1), timeout=120)
    with Load(urls(pods), seconds=FLEET_SECONDS, requests=FLEET_REQUESTS) as load:
        yield Fleet(namespace, operator, load, pods)
    assert load.sent > 0 and load.failed < load.sent / 10, (load.sent, load.failed)


@pytest.fixture
def calibrated(admin: client.ApiClient, fleet: Fleet) -> Fleet:
    """The shared deployment as every test but the first finds it: calibrated, no calibration
    running, every desired engine ready and under the load."""
    replicas = get_sd(admin, fleet.namespace, NAME)["spec"]["replicas"]

    def settled() -> list[Any] | None:
        done = sd_condition(admin, fleet.namespace, NAME, "Calibrated").get("status") == "True"
        idle = calibration_phase(admin, fleet.namespace, NAME) == "Idle"
        return (done and idle and all_ready(admin, fleet.namespace, NAME, replicas)) or None

    fleet.pods = wait_until("calibrated and idle", settled, timeout=180)
    fleet.load.retarget(urls(fleet.pods))
    return fleet


def calibration_phase(admin: client.ApiClient, namespace: str, name: str) -> str | None:
    return ((get_sd(admin, namespace, name).get("status") or {}).get("calibration") or {}).get(
        "phase"
    )


def exploring(url: str) -> bool | None:
    return speculation(url)["effective_exploration"] > 0.2 or None


def at_base(url: str) -> bool | None:
    return speculation(url)["effective_exploration"] == pytest.approx(BASE_EXPLORATION) or None


def scale(admin: client.ApiClient, namespace: str, replicas: int) -> None:
    client.CustomObjectsApi(admin).patch_namespaced_custom_object_scale(
        GROUP, VERSION, namespace, PLURAL, NAME, {"spec": {"replicas": replicas}}
    )


def test_advisory_recommends_without_touching_engines_and_manual_is_left_alone(
    admin: client.ApiClient, fleet: Fleet
) -> None:
    """Deployments of their own, while the shared one makes its first calibration."""
    namespace = fleet.namespace
    advisory = specdeployment("advisory", AUTO)
    advisory["spec"]["speculation"]["threshold"]["mode"] = "Advisory"
    manual = specdeployment("manual", AUTO)
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
    custom = client.CustomObjectsApi(admin)
    for name in ("advisory", "manual"):  # their engines leave the CPU to the shared deployment
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def test_auto_measures_the_crossover_and_every_engine_runs_it(
    cluster: Cluster, admin: client.ApiClient, fleet: Fleet
) -> None:
    """The first calibration (made while the Advisory test ran; the later tests watch the
    engines' exploration raised): the crossover measured, the threshold moved there,
    exploration lowered, and the engine, the ConfigMap and the engine's own metric all carry
    the threshold in status. Leaves the deployment calibrated, perhaps still verifying."""
    namespace = fleet.namespace
    wait_until(
        "Calibrated=True",
        lambda: sd_condition(admin, namespace, NAME, "Calibrated").get("status") == "True",
        timeout=120,
    )
    status = get_sd(admin, namespace, NAME)["status"]
    (h100,) = status["perSku"]
    threshold = status["threshold"]
    # START lies far below any crossover the engine can show: the estimate is past the dead
    # band, and the threshold moves there
    assert bucket_steps(START, threshold["recommended"]) > 1, threshold
    assert threshold["current"] == threshold["recommended"], threshold
    assert threshold["source"] == "Measured"
    assert h100["sku"] == H100 and h100["threshold"] == threshold["current"] and h100["reason"]
    assert h100["curve"] and status["crossover"]["curve"] == h100["curve"]
    assert status["crossover"]["sku"] == h100["sku"]
    reasons = [e.reason for e in events(admin, namespace, NAME)]
    assert "CalibrationStarted" in reasons and "ThresholdChanged" in reasons
    # the engine runs it, with exploration back at its base
    live = speculation(fleet.url)
    assert live["threshold"] == threshold["current"]
    assert live["exploration"] == pytest.approx(BASE_EXPLORATION)
    config = client.CoreV1Api(admin).read_namespaced_config_map(
        render.child_names(NAME)["config"], namespace
    )
    engine_yaml = yaml.safe_load(config.data[render.CONFIG_FILE])
    assert engine_yaml["speculation"]["threshold"] == threshold["current"]

    def scraped() -> bool | None:
        query = f'{contract.SPEC_THRESHOLD}{{namespace="{namespace}"}}'
        result = cluster.prometheus("/api/v1/query", query=query)["result"]
        return (
            bool(result) and all(float(r["value"][1]) == threshold["current"] for r in result)
        ) or None

    wait_until("spectune_spec_threshold = status.threshold.current", scraped, timeout=30)
    print(f"\nsimulated={simulated(cluster, namespace)}: start {START} -> {threshold}, {h100}")


def test_a_replica_change_recalibrates(admin: client.ApiClient, calibrated: Fleet) -> None:
    """Leaves two replicas, a calibration started for them."""
    namespace = calibrated.namespace
    scale(admin, namespace, 2)
    two = wait_until("2 ready engines", lambda: all_ready(admin, namespace, NAME, 2), 120)
    calibrated.load.retarget(urls(two))
    message = wait_until(
        "a calibration naming the replica change",
        lambda: calibration_started(admin, namespace, NAME, "replicas changed from 1 to 2"),
        120,
    )
    print(f"\nreplica trigger: {message}")


def test_a_pod_that_joins_mid_calibration_explores_only_once_prometheus_has_it(
    cluster: Cluster, admin: client.ApiClient, fleet: Fleet
) -> None:
    """Issue 59, F: a pod that became ready while a calibration explored got the raised share
    at once, while MetricsAvailable said it was not scraped. The calibration the replica change
    started explores; a third pod joins it: until Prometheus holds its series, it runs its
    base share. Leaves three replicas."""
    namespace = fleet.namespace
    wait_until(
        "the replica change's calibration exploring",
        lambda: calibration_phase(admin, namespace, NAME) == "Exploring" or None,
        60,
    )
    # a longer window keeps this calibration exploring while the third pod starts
    patch_sd(admin, namespace, NAME, {"tuning": {"calibrationWindowSeconds": 120}})
    before = {p.metadata.name for p in all_ready(admin, namespace, NAME, 2) or []}
    scale(admin, namespace, 3)
    three = wait_until("3 ready engines", lambda: all_ready(admin, namespace, NAME, 3), 120)
    assert calibration_phase(admin, namespace, NAME) == "Exploring"
    (new,) = [p for p in three if p.metadata.name not in before]
    (url,) = urls([new])
    fleet.load.retarget(urls(three))
    query = f'{contract.ENGINE_INFO}{{namespace="{namespace}",pod="{new.metadata.name}"}}'
    scraped_at = explored_at = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and explored_at is None:
        if scraped_at is None and cluster.prometheus("/api/v1/query", query=query)["result"]:
            scraped_at = time.monotonic()
        if speculation(url)["effective_exploration"] > BASE_EXPLORATION + 1e-9:
            explored_at = time.monotonic()
        time.sleep(0.2)
    assert explored_at is None or (scraped_at is not None and explored_at >= scraped_at), (
        f"explored {explored_at}, scraped {scraped_at}"
    )
    waited = None if explored_at is None or scraped_at is None else explored_at - scraped_at
    print(f"\nthe new pod explored {waited} s after Prometheus first had it")
    patch_sd(admin, namespace, NAME, {"tuning": {"calibrationWindowSeconds": FLEET_WINDOW}})


def test_a_killed_operator_leaves_no_engine_exploring_and_the_next_resumes(
    admin: client.ApiClient, calibrated: Fleet
) -> None:
    """Back to one replica (another calibration), and the operator SIGKILLed while it explores
    and kept down: the engine's exploration lease runs out and it returns to its base share by
    itself. The phase lives in status, so the next operator resumes the calibration and
    finishes it."""
    namespace, operator = calibrated.namespace, calibrated.operator
    scale(admin, namespace, 1)
    calibrated.pods = wait_until(
        "1 ready engine", lambda: all_ready(admin, namespace, NAME, 1), timeout=120
    )
    calibrated.load.retarget(urls(calibrated.pods))
    url = calibrated.url

    wait_until("exploration raised", lambda: exploring(url), timeout=120)
    # commit then act: status said Exploring before any engine explored
    assert calibration_phase(admin, namespace, NAME) == "Exploring"
    assert calibration_started(admin, namespace, NAME, "replicas changed from 3 to 1")
    operator.kill()
    killed = time.monotonic()
    try:
        # the lease expires one to one and a half leases after the last renewal
        wait_until("exploration back at its base, the operator down", lambda: at_base(url), 45)
        expired = time.monotonic() - killed
        phase = calibration_phase(admin, namespace, NAME)
    finally:
        operator.start()  # the module's next test needs it whatever happened here
    print(f"\nexploration back at its base {expired:.0f} s after the kill (lease {LEASE:.0f} s)")
    assert phase == "Exploring", phase
    wait_until(
        "the restarted operator finishing the calibration",
        lambda: calibration_phase(admin, namespace, NAME) in ("Verifying", "Idle") or None,
        timeout=120,
    )
    assert sd_condition(admin, namespace, NAME, "Calibrated")["status"] == "True"
    wait_until("exploration back at its base after the restart", lambda: at_base(url), 30)


def test_a_gpu_sku_change_recalibrates_on_the_new_sku(
    admin: client.ApiClient, calibrated: Fleet
) -> None:
    """The pods move from H100 to A100 nodes (a nodeSelector edit, as a migration would): the
    engines' `device` label changes, the operator says so and measures the A100's curve, and
    keeps the H100's. Leaves the engine on the A100, calibrated there."""
    namespace = calibrated.namespace
    patch_sd(admin, namespace, NAME, {"engine": {"nodeSelector": {"nvidia.com/gpu.product": A100}}})

    def moved() -> list[Any] | None:
        ready = all_ready(admin, namespace, NAME, 1)
        return ready if ready and ready[0].spec.node_name.startswith("gpu-a100") else None

    calibrated.pods = wait_until("the engine on the A100 node", moved, timeout=120)
    calibrated.load.retarget(urls(calibrated.pods))
    message = wait_until(
        "a calibration naming the SKU change",
        lambda: calibration_started(admin, namespace, NAME, "not measured yet"),
        150,
    )
    assert f"pods run on {A100}" in message and f"(measured: {H100})" in message, message

    def calibrated_on_a100() -> dict[str, Any] | None:
        status = get_sd(admin, namespace, NAME).get("status") or {}
        done = sd_condition(admin, namespace, NAME, "Calibrated").get("status") == "True"
        return next((s for s in status.get("perSku") or [] if s["sku"] == A100 and done), None)

    a100 = wait_until("calibrated on the A100", calibrated_on_a100, timeout=150)
    assert a100["reason"] and a100["pods"] == 1
    print(f"\nSKU trigger: {message}; {a100}")


def test_a_change_is_verified_or_rolled_back_after_prometheus_comes_back(
    admin: client.ApiClient, prometheus: OwnPrometheus, calibrated: Fleet
) -> None:
    """A re-check (the measurement's maximum age, a minute) that must move the threshold (its
    maximum lowered to 4), and Prometheus stopped while the change is being verified: Degraded,
    the change neither kept nor dropped while nothing can be read; started again, the change is
    verified or rolled back with an Event that says so, never silently kept."""
    namespace, url = calibrated.namespace, calibrated.url
    before = speculation(url)["threshold"]
    assert before > 4, before  # the A100's measured threshold (12 on this fleet)
    # 40 s windows: the change's verification deadline (three windows) stays well after the
    # 10-25 s the operator takes to see Prometheus gone (with 20 s windows a run rolled back
    # on that deadline before the test looked)
    patch_sd(admin, namespace, NAME, {"tuning": {"maxAgeSeconds": 60,
                                                 "calibrationWindowSeconds": 40},
                                      "speculation": {"threshold": {"max": 4}}})  # fmt: skip
    wait_until("Verifying the move to 4", lambda: calibration_phase(admin, namespace, NAME)
               == "Verifying" or None, timeout=180)  # fmt: skip
    # committed first, then pushed: the engine follows within the turn
    wait_until("the engine on 4", lambda: speculation(url)["threshold"] == 4, timeout=15)
    prometheus.stop()
    stopped = datetime.now(UTC).timestamp()
    try:  # started again whatever happens: the next test needs it
        degraded = wait_until(
            "Degraded=True (Prometheus unavailable)",
            lambda: (
                (c := sd_condition(admin, namespace, NAME, "Degraded")).get("status") == "True"
                and c
            ),
            timeout=60,
        )
        assert degraded["reason"] == "PrometheusUnavailable", degraded
        # no verdict without Prometheus: still Verifying, the engine on the changed threshold
        assert calibration_phase(admin, namespace, NAME) == "Verifying"
        assert speculation(url)["threshold"] == 4
    finally:
        prometheus.start()

    def verdict() -> Any:
        if calibration_phase(admin, namespace, NAME) != "Idle":
            return None
        after = [e for e in events(admin, namespace, NAME)
                 if e.metadata.creation_timestamp.timestamp() >= stopped - 1]  # fmt: skip
        return next(
            (e for e in reversed(after) if e.reason in ("ThresholdVerified", "RolledBack")), None
        )

    event = wait_until("a verdict once Prometheus is back", verdict, timeout=120)
    expected = 4 if event.reason == "ThresholdVerified" else before
    # the turn posts its Events before it pushes the engines: they follow within it
    wait_until(
        f"the engine on {expected} after {event.reason}: {event.message}",
        lambda: speculation(url)["threshold"] == expected,
        timeout=15,
    )
    print(f"\nafter Prometheus came back: {event.reason}: {event.message}")
    wait_until(
        "Degraded=False again",
        lambda: sd_condition(admin, namespace, NAME, "Degraded").get("status") == "False",
        timeout=60,
    )


def test_manual_pins_every_engine_and_auto_measures_again(
    admin: client.ApiClient, calibrated: Fleet
) -> None:
    """Auto -> Manual with a value: every engine runs that value within 30 s, whatever its
    SKU was measured at; Manual -> Auto starts a calibration from nothing measured."""
    namespace, url = calibrated.namespace, calibrated.url
    pinned = 2 if speculation(url)["threshold"] != 2 else 3  # within min 1 and max 4
    manual = {"mode": "Manual", "value": pinned}
    patch_sd(admin, namespace, NAME, {"speculation": {"threshold": manual}})
    wait_until("the pinned value", lambda: speculation(url)["threshold"] == pinned, 30)
    status = get_sd(admin, namespace, NAME)["status"]
    assert status["threshold"]["current"] == pinned and status["threshold"]["source"] == "Spec"
    assert status.get("perSku", []) == []
    since = datetime.now(UTC).timestamp()
    patch_sd(admin, namespace, NAME, {"speculation": {"threshold": {"mode": "Auto"}}})

    def started() -> dict[str, Any] | None:
        cal = get_sd(admin, namespace, NAME)["status"]["calibration"]
        return cal if cal.get("startedAt") and unix_time(cal["startedAt"]) >= since - 1 else None

    cal = wait_until("a calibration after Manual -> Auto", started, 60)
    assert cal["trigger"] == "Initial", cal


def test_a_k_change_re_measures_at_once_while_the_dwell_holds_a_move(
    admin: client.ApiClient, calibrated: Fleet
) -> None:
    """Issue 59, C: a move the minimum dwell held back sets `retryAfter` to the dwell's end (an
    hour here, written into status as such a move leaves it); k then changes from 4 to 6. The
    engines run a threshold measured for k = 4: the calibration of k = 6 starts within a turn,
    not an hour later."""
    namespace = calibrated.namespace
    before = {p.metadata.name for p in calibrated.pods}
    held = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    client.CustomObjectsApi(admin).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, NAME,
        {"status": {"calibration": {"retryAfter": held, "failures": 0}}},
    )  # fmt: skip
    since = datetime.now(UTC).timestamp()
    patch_sd(admin, namespace, NAME, {"speculation": {"numSpeculativeTokens": 6}})

    def rolled() -> list[Any] | None:  # k is read at start: the pod is replaced
        ready = all_ready(admin, namespace, NAME, 1)
        return ready if ready and ready[0].metadata.name not in before else None

    calibrated.load.retarget(urls(wait_until("the engine with k = 6", rolled, 120)))

    def started() -> str | None:
        return next(
            (e.message for e in events(admin, namespace, NAME)
             if e.reason == "CalibrationStarted" and "k 4 -> 6" in e.message
             and e.metadata.creation_timestamp.timestamp() >= since - 1),
            None,
        )  # fmt: skip

    message = wait_until("a calibration of k = 6", started, timeout=60)
    print(f"\nspec trigger through the dwell: {message}")
