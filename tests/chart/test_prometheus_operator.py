"""Prometheus as kube-prometheus-stack runs it, end to end, installed as README says: `helm
install` with the values README gives such a user (`operator.prometheusUrl`,
`monitoring.podMonitor.labels.release: kps`, `monitoring.podMonitor.interval: 30s`), and the
release's operator run as its Deployment runs it (its args, its ServiceAccount). The operator
makes the SpecDeployment a PodMonitor; the real Prometheus Operator (its real CRDs) selects it
by `release: kps` and generates the configuration of a Prometheus that scrapes every 30 s
(hack/cluster.sh). The autotuner finds the engine there by the labels the Prometheus Operator
attaches (namespace, pod), follows the 30 s interval it observes, refuses a calibration window
holding fewer than 8 scrapes set by hand (nothing explores), and with the window left unset
takes 8 scrapes, 240 s, shows it in status and calibrates: the threshold is measured and the
engine runs it. Each engine is scraped once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from spectune.engine import contract
from spectune.operator.autotune import MIN_SCRAPES_PER_WINDOW
from tests.cluster.support import Cluster
from tests.operator.e2e import Load, speculation, urls
from tests.operator.support import (
    AUTO,
    all_ready,
    create,
    delete_specdeployments,
    get_sd,
    patch_sd,
    sd_condition,
    specdeployment,
)
from tests.support.ports import free_ports
from tests.support.waiting import wait_until

from .release import Release, charts_operator, installed

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.usefixtures("helm_binary")]

NAME = "kps"
INTERVAL = 30  # the Prometheus object's scrapeInterval, and the chart's podMonitor.interval
SHORT = 120  # the default calibration window: 4 scrapes at 30 s
BASE_EXPLORATION = 0.02  # tuning.explorationPercent's default, as a share


@pytest.fixture(scope="module")
def release(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """README's kube-prometheus-stack install, and its operator running."""
    values = {
        "operator": {"prometheusUrl": cluster.kps_prometheus_url},
        "monitoring": {"podMonitor": {"interval": f"{INTERVAL}s", "labels": {"release": "kps"}}},
    }
    tmp = tmp_path_factory.mktemp("kps")
    with (
        installed(cluster, tmp, values, prefix="kps") as release,
        charts_operator(cluster, release, free_ports(2)) as operator,
    ):
        try:
            yield release
        finally:
            with cluster.api() as admin:
                delete_specdeployments(admin, release.watched)
            print(operator.log.read_text()[-3000:])


@pytest.fixture(scope="module")
def admin(cluster: Cluster) -> Iterator[client.ApiClient]:
    with cluster.api() as api:
        yield api


def kps_target(cluster: Cluster, namespace: str, pod: str) -> dict[str, Any] | None:
    """The kps Prometheus's active target for this pod, once it has been scraped."""
    data = cluster.prometheus("/api/v1/targets", url=cluster.kps_prometheus_url, state="active")
    for target in data["activeTargets"]:
        labels = target["labels"]
        if labels.get("namespace") == namespace and labels.get("pod") == pod:
            return target if target["health"] == "up" else None
    return None


def series_per_pod(cluster: Cluster, url: str, namespace: str) -> dict[str, int]:
    """Pod -> how many spectune_engine_info series it has in the Prometheus at `url` (the
    cluster's other, hand-configured Prometheus scrapes every engine too, standing in for the
    other tests' PodMonitors: a second server, not a second scrape in one)."""
    query = f'count by (pod) ({contract.ENGINE_INFO}{{namespace="{namespace}"}})'
    result = cluster.prometheus("/api/v1/query", url=url, query=query)["result"]
    return {r["metric"]["pod"]: int(float(r["value"][1])) for r in result}


def test_a_kube_prometheus_stack_install_calibrates_at_30_s_scrapes(
    cluster: Cluster, admin: client.ApiClient, release: Release
) -> None:
    watched = release.watched
    tuning = {**AUTO["tuning"], "calibrationWindowSeconds": SHORT}
    create(admin, watched, specdeployment(NAME, AUTO, tuning=tuning))
    (pod,) = wait_until("1 ready engine", lambda: all_ready(admin, watched, NAME, 1), timeout=120)
    (url,) = urls([pod])
    shares: list[float] = []

    def seen(reason: str) -> dict | None:
        shares.append(speculation(url)["effective_exploration"])
        condition = sd_condition(admin, watched, NAME, "MetricsAvailable")
        return condition if condition.get("reason") == reason else None

    with Load([url], seconds=900, requests=20000) as load:
        target = wait_until(
            "the engine a target of the kps Prometheus",
            lambda: kps_target(cluster, watched, pod.metadata.name),
            timeout=90,
        )
        # the job the Prometheus Operator makes of the operator's PodMonitor, at the interval
        # the chart asked for
        assert target["scrapePool"] == f"podMonitor/{watched}/{NAME}/0", target
        assert target["scrapeInterval"] == f"{INTERVAL}s", target
        assert target["labels"]["app_kubernetes_io_instance"] == NAME, target["labels"]

        # two scrapes show the interval; then a 120 s window set by hand is refused, with the
        # reason
        condition = wait_until(
            "MetricsAvailable=False (CalibrationWindowTooShort)",
            lambda: seen("CalibrationWindowTooShort"),
            timeout=4 * INTERVAL + 30,
        )
        assert condition["status"] == "False", condition
        assert f"{INTERVAL} s scrape interval observed" in condition["message"], condition
        assert f"needs {MIN_SCRAPES_PER_WINDOW}" in condition["message"], condition
        assert max(shares) == pytest.approx(BASE_EXPLORATION), shares
        assert sd_condition(admin, watched, NAME, "Calibrated")["reason"] == "NotMeasured"

        # the window left unset, as README now says: 8 scrapes, 240 s, shown in status. The
        # engine is read once its series holds two intervals (a counter's two samples), then a
        # calibration runs and moves the threshold
        started = time.monotonic()
        long = MIN_SCRAPES_PER_WINDOW * INTERVAL
        patch_sd(admin, watched, NAME, {"tuning": {"calibrationWindowSeconds": None}})
        assert "calibrationWindowSeconds" not in get_sd(admin, watched, NAME)["spec"]["tuning"]
        wait_until(
            "status to show the 240 s window",
            lambda: get_sd(admin, watched, NAME)["status"].get("calibrationWindowSeconds") == long,
            timeout=60,
        )

        def scraped() -> dict | None:
            condition = seen("EnginesScraped")
            return condition if condition and "warming" not in condition["message"] else None

        condition = wait_until("MetricsAvailable=True, warm", scraped, timeout=3 * INTERVAL)
        assert condition["message"] == "1 of 1 ready engines scraped", condition
        warm = time.monotonic() - started

        def calibrated() -> dict | None:
            done = sd_condition(admin, watched, NAME, "Calibrated").get("status") == "True"
            return get_sd(admin, watched, NAME)["status"] if done else None

        status = wait_until("Calibrated=True", calibrated, timeout=3 * long + 120)
    assert load.sent > 0 and load.failed < load.sent / 10, (load.sent, load.failed)
    threshold, (sku,) = status["threshold"], status["perSku"]
    assert threshold["source"] == "Measured" and sku["threshold"] == threshold["current"]
    assert speculation(url)["threshold"] == threshold["current"]  # the engine runs it

    # one series per engine: the PodMonitor's scrape only, and no annotation that a Prometheus
    # also discovering pods by annotation would scrape a second time
    assert series_per_pod(cluster, cluster.kps_prometheus_url, watched) == {pod.metadata.name: 1}
    assert "prometheus.io/scrape" not in (pod.metadata.annotations or {})
    print(
        f"\nkps target {target['scrapePool']} every {target['scrapeInterval']}; 120 s window "
        f"refused; unset, {long} s, the engine warm {warm:.0f} s after the patch; calibrated "
        f"{time.monotonic() - started:.0f} s after it: {threshold}, sent {load.sent}"
    )
