"""What the local cluster changes in the Prometheus Operator's configuration to run it outside a
pod (hack/config_reloader.py), without a cluster: only discovery's credentials, the pod-name
substitution, the rule files' folder and the loopback rule; the rest is the operator's."""

from __future__ import annotations

import copy
import re
from pathlib import Path

from tests.cluster.support import load_script

reloader = load_script("config_reloader")

KUBECONFIG = Path("/state/prometheus/kubeconfig")
RULES = Path("/state/prometheus-kps/rules")
# The shape v0.85 generates for a Prometheus object `kps` and one PodMonitor (abridged).
GENERATED = {
    "global": {
        "scrape_interval": "30s",
        "external_labels": {"prometheus": "monitoring/kps", "prometheus_replica": "$(POD_NAME)"},
    },
    "rule_files": ["/etc/prometheus/rules/prometheus-kps-rulefiles-0/*.yaml"],
    "scrape_configs": [
        {
            "job_name": "podMonitor/ns/llm/0",
            "scrape_interval": "30s",
            "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": ["ns"]}}],
            "relabel_configs": [
                {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}
            ],
        },
        {"job_name": "static", "static_configs": [{"targets": ["127.0.0.1:9090"]}]},
    ],
}


def test_discovery_authenticates_with_the_kubeconfig_and_keeps_the_operators_settings() -> None:
    out = reloader.adapt(copy.deepcopy(GENERATED), KUBECONFIG, RULES)
    (sd,) = out["scrape_configs"][0]["kubernetes_sd_configs"]
    assert sd == {
        "role": "pod",
        "namespaces": {"names": ["ns"]},
        "kubeconfig_file": str(KUBECONFIG),
    }
    assert out["scrape_configs"][0]["scrape_interval"] == "30s"
    assert "kubernetes_sd_configs" not in out["scrape_configs"][1]
    assert out["global"]["scrape_interval"] == "30s"


def test_pod_name_and_shard_are_substituted_as_the_sidecar_does_for_pod_0() -> None:
    generated = "prometheus_replica: $(POD_NAME)\nregex: $(SHARD);|.+;.+\nkeep: $(OTHER)\n"
    assert reloader.substitute(generated, "kps") == (
        "prometheus_replica: prometheus-kps-0\nregex: 0;|.+;.+\nkeep: $(OTHER)\n"
    )


def test_rules_are_read_from_the_state_folder() -> None:
    out = reloader.adapt(copy.deepcopy(GENERATED), KUBECONFIG, RULES)
    assert out["rule_files"] == [f"{RULES}/prometheus-kps-rulefiles-0/*.yaml"]


def test_every_job_ends_keeping_only_loopback_addresses() -> None:
    out = reloader.adapt(copy.deepcopy(GENERATED), KUBECONFIG, RULES)
    for job, given in zip(out["scrape_configs"], GENERATED["scrape_configs"], strict=True):
        assert job["relabel_configs"][:-1] == given.get("relabel_configs", [])
        assert job["relabel_configs"][-1] == reloader.LOOPBACK_KEEP
    # strings matched against the rule's regex only: nothing here dials an address
    keep = re.compile(reloader.LOOPBACK_KEEP["regex"])
    assert keep.fullmatch("127.0.1.7:8000") and keep.fullmatch("127.0.0.1")
    assert not keep.fullmatch("10.0.0.1:8000") and not keep.fullmatch("1127.0.0.1:80")


def test_the_generated_configuration_is_not_changed_in_place() -> None:
    given = copy.deepcopy(GENERATED)
    reloader.adapt(given, KUBECONFIG, RULES)
    assert given == GENERATED
