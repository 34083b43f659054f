"""Rendering children from a spec: pure, so tested without a cluster."""

from __future__ import annotations

import re

import pytest
import yaml

from spectune.engine.serving.settings import ServeSettings
from spectune.operator import autotune, render
from spectune.operator.models import SpecDeploymentSpec, parse_spec
from spectune.operator.prometheus import LabelNames

SPEC = parse_spec(
    {
        "replicas": 3,
        "model": {"name": "tiny-target", "dtype": "bfloat16"},
        "engine": {
            "gpus": 1,
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "resources": {"requests": {"cpu": 2, "memory": "4Gi"}},
            "port": 8100,
        },
        "speculation": {"method": "draft", "draft": "tiny-draft", "numSpeculativeTokens": 5},
        "slo": {"ttftMilliseconds": 500, "tpotMilliseconds": 40},
    }
)


def test_engine_config_is_a_valid_engine_settings_file() -> None:
    config = render.engine_config(SPEC, threshold=12, exploration_percent=2)
    settings = ServeSettings.model_validate(config)  # the engine's own validator accepts it
    assert settings.draft == "tiny-draft" and settings.speculation.k == 5
    assert settings.speculation.threshold == 12 and settings.speculation.exploration == 0.02
    assert settings.slo.ttft_ms == 500 and settings.port == 8100 and settings.dtype == "bfloat16"
    mounted = render.config_map("llm", "ns", config)["data"][render.CONFIG_FILE]
    assert yaml.safe_load(mounted) == config


def test_deployment_carries_gpus_selector_probes_scrape_annotations_and_mounts() -> None:
    d = render.deployment("llm", "ns", SPEC, render.engine_config(SPEC, 12, 2))
    assert d["spec"]["replicas"] == 3
    pod = d["spec"]["template"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "8100"
    assert set(d["spec"]["selector"]["matchLabels"].items()) <= set(
        pod["metadata"]["labels"].items()
    )
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["requests"] == {
        "cpu": "2",
        "memory": "4Gi",
        "nvidia.com/gpu": "1",
    }
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8100}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "--config" in container["args"] and "--admin-token-file" in container["args"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "llm-engine-config"
    assert volumes["admin-token"]["secret"]["secretName"] == "llm-admin-token"


def test_cpu_only_spec_has_no_gpu_and_no_node_selector() -> None:
    spec = SpecDeploymentSpec.model_validate({"model": {"name": "tiny-target"}})
    config = render.engine_config(spec, None, 2)
    pod = render.deployment("x", "ns", spec, config)["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod and pod["containers"][0]["resources"] == {}


def config_hash(spec: SpecDeploymentSpec, threshold: int | None, exploration: int = 2) -> str:
    deployment = render.deployment(
        "llm", "ns", spec, render.engine_config(spec, threshold, exploration)
    )
    return deployment["spec"]["template"]["metadata"]["annotations"][render.CONFIG_HASH_ANNOTATION]


def changed(**changes: object) -> SpecDeploymentSpec:
    """SPEC with some fields replaced; a key names a path (`slo__tpotMilliseconds`)."""
    data = SPEC.model_dump()
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = data
        for key in parents:
            node = node[key]
        node[leaf] = value
    return parse_spec(data)


@pytest.mark.parametrize(
    "change",
    [
        {"speculation__numSpeculativeTokens": 3},
        {"model__name": "other-target"},
        {"model__dtype": "float16"},
        {"speculation__draft": "other-draft"},
        {"speculation__method": "ngram", "speculation__draft": None},
        {"slo__tpotMilliseconds": 80},
        {"engine__maxBatchSize": 32},
    ],
)
def test_settings_read_at_start_roll_the_pods(change: dict[str, object]) -> None:
    assert config_hash(changed(**change), 12) != config_hash(SPEC, 12)


def test_run_time_speculation_settings_do_not_roll_the_pods() -> None:
    assert config_hash(SPEC, 12) == config_hash(SPEC, 7) == config_hash(SPEC, None)
    assert config_hash(SPEC, 12, exploration=20) == config_hash(SPEC, 12)
    hysteresis = render.engine_config(SPEC, 12, 2)
    hysteresis["speculation"]["hysteresis"] = 3.0
    assert render.start_config_hash(hysteresis) == render.start_config_hash(
        render.engine_config(SPEC, 12, 2)
    )


def test_service_and_pod_monitor_select_the_engine_pods() -> None:
    assert render.service("llm", "ns", SPEC)["spec"]["selector"] == render.selector("llm")
    monitor = render.pod_monitor("llm", "ns")
    assert monitor["spec"]["selector"]["matchLabels"] == render.selector("llm")
    # the Prometheus Operator gives namespace and pod only; the reader selects by instance too
    (target_label,) = monitor["spec"]["podTargetLabels"]
    sanitized = re.sub(r"[^a-zA-Z0-9_]", "_", target_label)  # as Prometheus names it
    assert sanitized == LabelNames().instance and target_label in render.selector("llm")
    assert render.selector_string("llm") == (
        "app.kubernetes.io/name=spectune-engine,app.kubernetes.io/instance=llm"
    )


def test_the_pod_monitors_interval_gives_the_default_window_its_scrapes() -> None:
    (endpoint,) = render.pod_monitor("llm", "ns")["spec"]["podMetricsEndpoints"]
    interval = float(endpoint["interval"].removesuffix("s"))
    default = parse_spec({"model": {"name": "tiny-target"}})
    assert autotune.window_too_short(default, interval) is None
    assert autotune.window_too_short(default, 2 * interval) is not None


def test_pod_annotations_reach_the_pod_template_and_cannot_override_ours() -> None:
    spec = SPEC.model_copy(
        update={
            "engine": SPEC.engine.model_copy(
                update={
                    "podAnnotations": {
                        "spectune.io/simulate-gpu": "true",
                        "prometheus.io/port": "1",
                    }
                }
            )
        }
    )
    config = render.engine_config(spec, 12, 2)
    annotations = render.deployment("llm", "ns", spec, config)["spec"]["template"]["metadata"][
        "annotations"
    ]
    assert annotations["spectune.io/simulate-gpu"] == "true"
    assert annotations["prometheus.io/port"] == "8100"
    assert annotations[render.CONFIG_HASH_ANNOTATION] == render.start_config_hash(config)


def test_the_pod_monitor_carries_the_labels_a_prometheus_selects_by_not_over_ours() -> None:
    settings = render.PodMonitorSettings(
        "30s", {"release": "kps", "app.kubernetes.io/instance": "other"}
    )
    monitor = render.pod_monitor("llm", "ns", settings)
    assert monitor["metadata"]["labels"] == {"release": "kps", **render.labels("llm")}
    assert monitor["spec"]["podMetricsEndpoints"][0]["interval"] == "30s"


def test_no_engine_pod_monitors_leaves_the_pod_monitor_out() -> None:
    """The chart's PodMonitor covers every engine; one per SpecDeployment would scrape twice."""
    from spectune.operator import handlers

    config = render.engine_config(SPEC, 12, 2)
    objs = handlers.children("llm", "ns", SPEC, config, pod_monitor=None, monitors_served=True)
    assert [o["kind"] for o in objs] == ["ConfigMap", "Deployment", "Service"]
    assert not scrape_annotations(objs)  # the chart's PodMonitor scrapes them


def scrape_annotations(objs: list[dict]) -> dict[str, str]:
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    return {k: v for k, v in annotations.items() if k.startswith("prometheus.io/")}


@pytest.mark.parametrize(
    ("served", "asked", "monitor", "annotated"),
    [(True, False, True, False), (False, False, False, True), (True, True, True, True)],
    ids=["podmonitors-served", "no-podmonitor-crd", "annotations-asked-for"],
)
def test_engines_are_scraped_once_by_a_pod_monitor_or_by_annotation(
    served: bool, asked: bool, monitor: bool, annotated: bool
) -> None:
    """Where the cluster serves PodMonitors, one scrapes the engines and the pods carry no
    prometheus.io annotations (both would scrape every engine twice); without the CRD the
    annotations are the way; `--scrape-annotations` adds them anyway."""
    from spectune.operator import handlers

    config = render.engine_config(SPEC, 12, 2)
    objs = handlers.children(
        "llm", "ns", SPEC, config, monitors_served=served, scrape_annotations=asked
    )
    assert ("PodMonitor" in [o["kind"] for o in objs]) == monitor
    expected = {"prometheus.io/scrape": "true", "prometheus.io/port": "8100",
                "prometheus.io/path": "/metrics"}  # fmt: skip
    assert scrape_annotations(objs) == (expected if annotated else {})
