"""Metrics first, end to end: an Auto deployment whose engines the operator cannot find in
Prometheus (here its pod label flag names a label no target has, as a relabeling that drops
it would) never explores, and its MetricsAvailable condition says why."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kubernetes import client

from tests.cluster.support import Cluster
from tests.support.waiting import wait_until

from .e2e import events, speculation, urls
from .support import AUTO, all_ready, create, own_operator, sd_condition, specdeployment

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NAME = "blind"
MISSING_LABEL = "no_such_label"
BASE_EXPLORATION = 0.02  # tuning.explorationPercent's default, as a share


@pytest.fixture(scope="module")
def blind(cluster: Cluster, admin: client.ApiClient, tmp_path_factory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("blind")
    extra = ["--prometheus-pod-label", MISSING_LABEL]
    with own_operator(cluster, admin, tmp, "unscraped", 172, extra) as namespace:
        yield namespace


def test_unscraped_engines_never_explore_and_the_condition_says_why(
    admin: client.ApiClient, blind: str
) -> None:
    create(admin, blind, specdeployment(NAME, AUTO))
    pods = wait_until("1 ready engine", lambda: all_ready(admin, blind, NAME, 1), timeout=120)
    ready_at = time.monotonic()
    (url,) = urls(pods)
    shares: list[float] = []

    def not_scraped() -> dict | None:
        shares.append(speculation(url)["effective_exploration"])
        condition = sd_condition(admin, blind, NAME, "MetricsAvailable")
        return condition if condition.get("status") == "False" else None

    # the grace a scraped engine needs to show fresh, warm series, then one turn
    condition = wait_until("MetricsAvailable=False", not_scraped, timeout=90)
    said = time.monotonic() - ready_at
    assert condition["reason"] == "EnginesNotScraped", condition
    assert pods[0].metadata.name in condition["message"], condition
    assert f"{MISSING_LABEL}=~" in condition["message"], condition  # the selector queried
    # the cause, from Prometheus's targets: the pod is scraped, without the label queried
    assert f"without the label(s) {MISSING_LABEL} the operator selects" in condition["message"]
    for _ in range(4):  # two turns more: still nothing explores
        shares.append(speculation(url)["effective_exploration"])
        time.sleep(5)
    assert max(shares) == pytest.approx(BASE_EXPLORATION), shares
    cal = sd_condition(admin, blind, NAME, "Calibrated")
    assert cal["reason"] == "NotMeasured", cal
    warned = [e for e in events(admin, blind, NAME) if e.reason == "EnginesNotScraped"]
    assert len(warned) == 1 and warned[0].type == "Warning", warned
    print(f"\nMetricsAvailable=False {said:.0f} s after the engine was ready: {condition}")
