"""Why a ready engine pod has no series: each cause Prometheus's targets API can show, told
apart, and the targets read from an answer shaped like the real one."""

from __future__ import annotations

from typing import Any

import pytest

from spectune.operator.observations import LabelNames, MetricsUnavailable
from spectune.operator.prometheus import PrometheusReader, PrometheusUnavailable
from spectune.operator.scraping import (
    NAMESPACE_META,
    POD_META,
    ScrapeTarget,
    TargetsCache,
    why_unscraped,
)

NS = "team-a"
FOUND = {POD_META: "llm-0", NAMESPACE_META: NS}
LABELS = {"namespace": NS, "pod": "llm-0", "app_kubernetes_io_instance": "llm", "job": "pods"}


def why(*targets: ScrapeTarget, names: LabelNames | None = None) -> str:
    return why_unscraped(targets, ["llm-0"], NS, names or LabelNames())["llm-0"]


def test_each_cause_is_told_apart() -> None:
    other = ScrapeTarget("pods", {**LABELS, "pod": "llm-1"}, {**FOUND, POD_META: "llm-1"}, "up")
    assert why(other).startswith("Prometheus has no target for it: no PodMonitor")
    dropped = ScrapeTarget("kubernetes-pods", {}, FOUND, dropped=True)
    assert why(dropped) == "Prometheus discovers it (kubernetes-pods) but its relabeling drops it"
    down = ScrapeTarget("podMonitor/team-a/llm/0", LABELS, FOUND, "down", "connection refused")
    assert why(down) == "its scrape fails (podMonitor/team-a/llm/0: connection refused)"
    bare = {k: v for k, v in LABELS.items() if k != "namespace"}
    unlabelled = why(ScrapeTarget("podMonitor/team-a/llm/0", bare, FOUND, "up"))
    assert "without the label(s) namespace the operator selects" in unlabelled
    assert "(its labels: app_kubernetes_io_instance, job, pod;" in unlabelled
    renamed = why(ScrapeTarget("pods", LABELS, FOUND, "up"), names=LabelNames(pod="kube_pod"))
    assert "without the label(s) kube_pod the operator selects" in renamed
    fine = ScrapeTarget("pods", LABELS, FOUND, "up")
    assert why(fine) == "scraped (pods) but no fresh spectune_engine_info series yet"
    # one of two jobs dropping it does not hide the one that scrapes it
    assert why(dropped, fine) == why(fine)


def test_a_target_needs_no_instance_label() -> None:
    """Namespace and pod are all the operator reads by: what a Prometheus Operator PodMonitor
    without podTargetLabels carries."""
    bare = {k: v for k, v in LABELS.items() if k != "app_kubernetes_io_instance"}
    target = ScrapeTarget("podMonitor/team-a/llm/0", bare, FOUND, "up")
    assert (
        why(target)
        == "scraped (podMonitor/team-a/llm/0) but no fresh spectune_engine_info series yet"
    )


def test_a_static_target_is_matched_by_its_labels() -> None:
    """Targets from static or file configs carry no pod discovery labels."""
    static = ScrapeTarget("static", {**LABELS, "pod": "x"}, {}, "up")
    assert why(static).startswith("Prometheus has no target for it")
    assert why(ScrapeTarget("static", LABELS, {}, "up")).startswith("scraped (static)")


class Targets:
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def get_targets(self, state: str | None = None) -> Any:
        assert state == "any"
        return self.answer


def test_the_reader_takes_active_and_dropped_targets() -> None:
    answer = {
        "activeTargets": [{"discoveredLabels": FOUND, "labels": LABELS, "scrapePool": "pods",
                           "health": "down", "lastError": "timeout"}],
        "droppedTargets": [{"discoveredLabels": {**FOUND, POD_META: "llm-1"}}],
    }  # fmt: skip
    targets = PrometheusReader("http://unused", client=Targets(answer)).targets()
    assert targets == [
        ScrapeTarget("pods", LABELS, FOUND, "down", "timeout"),
        ScrapeTarget("", {}, {**FOUND, POD_META: "llm-1"}, dropped=True),
    ]
    for garbage in ({"activeTargets": [{}]}, [], {"droppedTargets": []}):
        with pytest.raises(PrometheusUnavailable, match="not a targets answer"):
            PrometheusReader("http://unused", client=Targets(garbage)).targets()


def test_the_targets_answer_is_fetched_once_per_ttl_and_a_failure_is_not_cached() -> None:
    """Every overdue deployment asks each turn; Prometheus answers at most once per ttl."""
    fetched: list[float] = []
    cache = TargetsCache(ttl=30.0)

    def fetch() -> list[ScrapeTarget]:
        fetched.append(now)
        return [ScrapeTarget(f"pool-{len(fetched)}")]

    for now in (100.0, 110.0, 129.9):
        assert cache.get(now, fetch) == [ScrapeTarget("pool-1")]
    now = 130.0
    assert cache.get(now, fetch) == [ScrapeTarget("pool-2")]
    now = 50.0  # a clock that went back: fetch again rather than trust the future
    assert cache.get(now, fetch) == [ScrapeTarget("pool-3")]
    assert fetched == [100.0, 130.0, 50.0]

    def down() -> list[ScrapeTarget]:
        raise MetricsUnavailable("targets: connection refused")

    with pytest.raises(MetricsUnavailable):
        cache.get(200.0, down)
    assert cache.get(201.0, fetch) == [ScrapeTarget("pool-4")]
