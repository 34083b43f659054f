"""Prometheus as kube-prometheus-stack runs it, end to end. The real Prometheus Operator (with
its real CRDs) selects the operator's PodMonitor by the `release: kps` label the chart's values
tell such a user to set, and generates the configuration of a Prometheus that scrapes every
30 s (hack/cluster.sh). The autotuner finds the engine there by the labels the Prometheus
Operator attaches (namespace, pod) and the instance label the PodMonitor carries, follows the
30 s interval it observes, and so refuses a calibration window holding fewer than 8 scrapes,
then takes one long enough. Nothing explores before."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from spectune.operator.autotune import MIN_SCRAPES_PER_WINDOW
from tests.cluster.support import Cluster
from tests.support.waiting import wait_until

from .e2e import speculation, urls
from .support import AUTO, all_ready, create, own_operator, patch_sd, sd_condition, specdeployment

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NAME = "kps"
INTERVAL = 30  # the Prometheus object's scrapeInterval, and the PodMonitor's
SHORT = 120  # the default calibration window: 4 scrapes at 30 s
BASE_EXPLORATION = 0.02  # tuning.explorationPercent's default, as a share


@pytest.fixture(scope="module")
def watched(cluster: Cluster, admin: client.ApiClient, tmp_path_factory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("kps")
    extra = ["--pod-monitor-label", "release=kps", "--pod-monitor-interval", f"{INTERVAL}s"]
    with own_operator(
        cluster, admin, tmp, "kps", 173, extra, prometheus_url=cluster.kps_prometheus_url
    ) as namespace:
        yield namespace


def kps_target(cluster: Cluster, namespace: str, pod: str) -> dict[str, Any] | None:
    """The kps Prometheus's active target for this pod, once it has been scraped."""
    data = cluster.prometheus("/api/v1/targets", url=cluster.kps_prometheus_url, state="active")
    for target in data["activeTargets"]:
        labels = target["labels"]
        if labels.get("namespace") == namespace and labels.get("pod") == pod:
            return target if target["health"] == "up" else None
    return None


def test_the_prometheus_operators_prometheus_at_30_s_scrapes_is_read_and_followed(
    cluster: Cluster, admin: client.ApiClient, watched: str
) -> None:
    tuning = {**AUTO["tuning"], "calibrationWindowSeconds": SHORT}
    create(admin, watched, specdeployment(NAME, AUTO, tuning=tuning))
    (pod,) = wait_until("1 ready engine", lambda: all_ready(admin, watched, NAME, 1), timeout=120)
    (url,) = urls([pod])
    shares: list[float] = []

    def seen(reason: str) -> dict | None:
        shares.append(speculation(url)["effective_exploration"])
        condition = sd_condition(admin, watched, NAME, "MetricsAvailable")
        return condition if condition.get("reason") == reason else None

    target = wait_until(
        "the engine a target of the kps Prometheus",
        lambda: kps_target(cluster, watched, pod.metadata.name),
        timeout=90,
    )
    # the job the Prometheus Operator makes of a PodMonitor, at the interval it asked for
    assert target["scrapePool"] == f"podMonitor/{watched}/{NAME}/0", target
    assert target["scrapeInterval"] == f"{INTERVAL}s", target
    assert target["labels"]["app_kubernetes_io_instance"] == NAME, target["labels"]

    # two scrapes show the interval; then the default window is refused, with the reason
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

    # a window of 8 scrapes is taken, and the engine is read once its series holds two
    # intervals (a counter's two samples): a calibration may start
    started = time.monotonic()
    patch_sd(admin, watched, NAME, {"tuning": {"calibrationWindowSeconds": 8 * INTERVAL}})

    def scraped() -> dict | None:
        condition = seen("EnginesScraped")
        return condition if condition and "warming" not in condition["message"] else None

    condition = wait_until("MetricsAvailable=True, warm", scraped, timeout=3 * INTERVAL)
    assert condition["status"] == "True", condition
    assert condition["message"] == "1 of 1 ready engines scraped", condition
    assert max(shares) == pytest.approx(BASE_EXPLORATION), shares
    print(
        f"\nkps target {target['scrapePool']} every {target['scrapeInterval']}; "
        f"window refused, then taken {time.monotonic() - started:.0f} s after the patch: "
        f"{condition['message']}"
    )
