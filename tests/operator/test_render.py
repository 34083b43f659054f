"""Rendering children from a spec: pure, so tested without a cluster."""

from __future__ import annotations

import re

import pytest
import yaml

from spectune.engine.serving.settings import ServeSettings
from spectune.operator import autotune, render
from spectune.operator.models import SpecDeploymentSpec, parse_spec

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
    startup = container["startupProbe"]  # Ready means loaded and warm: liveness waits for it
    assert startup["httpGet"]["path"] == "/readyz"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 15 * 60
    assert "--config" in container["args"] and "--admin-token-file" in container["args"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "llm-engine-config"
    assert volumes["admin-token"]["secret"]["secretName"] == "llm-admin-token"


def test_cpu_only_spec_has_no_gpu_and_no_node_selector() -> None:
    spec = SpecDeploymentSpec.model_validate({"model": {"name": "tiny-target"}})
    config = render.engine_config(spec, None, 2)
    pod = render.deployment("x", "ns", spec, config)["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "1", "memory": "2Gi"}}


@pytest.mark.parametrize(
    ("resources", "requests", "limits"),
    [
        ({}, {"cpu": "2", "memory": "16Gi", "nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "1"}),
        (
            {"requests": {"cpu": 8}, "limits": {"memory": "8Gi"}},
            {"cpu": "8", "nvidia.com/gpu": "1"},  # the limit is the memory request (Kubernetes)
            {"memory": "8Gi", "nvidia.com/gpu": "1"},
        ),
    ],
)
def test_gpu_engines_request_cpu_and_memory_so_they_are_not_best_effort(
    resources, requests, limits
) -> None:
    """GPUs do not count for QoS: with nvidia.com/gpu alone a pod is BestEffort, evicted first."""
    spec = SpecDeploymentSpec.model_validate(
        {"model": {"name": "m"}, "engine": {"gpus": 1, "resources": resources}}
    )
    pod = render.deployment("x", "ns", spec, render.engine_config(spec, None, 2))
    container = pod["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {"requests": requests, "limits": limits}


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
    per_sku = render.engine_config(SPEC, 12, 2, {"NVIDIA-L4": 24})  # measured per SKU: no roll
    assert render.start_config_hash(per_sku) == render.start_config_hash(
        render.engine_config(SPEC, 12, 2)
    )
    hysteresis = render.engine_config(SPEC, 12, 2)
    hysteresis["speculation"]["hysteresis"] = 3.0
    assert render.start_config_hash(hysteresis) == render.start_config_hash(
        render.engine_config(SPEC, 12, 2)
    )


def test_service_and_pod_monitor_select_the_engine_pods() -> None:
    assert render.service("llm", "ns", SPEC)["spec"]["selector"] == render.selector("llm")
    monitor = render.pod_monitor("llm", "ns")
    assert monitor["spec"]["selector"]["matchLabels"] == render.selector("llm")
    # the Prometheus Operator gives namespace and pod only (all the reader needs); the alerts
    # and the dashboard group by the SpecDeployment's instance label too
    (target_label,) = monitor["spec"]["podTargetLabels"]
    sanitized = re.sub(r"[^a-zA-Z0-9_]", "_", target_label)  # as Prometheus names it
    assert sanitized == "app_kubernetes_io_instance" and target_label in render.selector("llm")
    assert render.selector_string("llm") == (
        "app.kubernetes.io/name=spectune-engine,app.kubernetes.io/instance=llm"
    )


def test_the_default_window_holds_its_scrapes_at_the_pod_monitors_interval_and_longer() -> None:
    """The window a user leaves unset follows the scrape interval the operator sees: 120 s at
    the PodMonitor's 15 s, 240 s at kube-prometheus-stack's 30 s (README asked users to set
    that by hand); a window set by hand is the user's, and refused when too short."""
    (endpoint,) = render.pod_monitor("llm", "ns")["spec"]["podMetricsEndpoints"]
    interval = float(endpoint["interval"].removesuffix("s"))
    default = parse_spec({"model": {"name": "tiny-target"}})
    for seen, window in ((None, 120), (interval, 120), (30.011, 240), (60.0, 480)):
        resolved = autotune.with_window(default, seen)
        assert resolved.tuning.calibrationWindowSeconds == window
        assert autotune.window_too_short(resolved, seen) is None
    by_hand = parse_spec({"model": {"name": "m"}, "tuning": {"calibrationWindowSeconds": 120}})
    assert autotune.with_window(by_hand, 30.0) == by_hand
    assert "holds 4.0 scrapes" in autotune.window_too_short(by_hand, 30.0)


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


CLAIMED = parse_spec(
    {
        "model": {"name": "llama/8b", "volume": {"persistentVolumeClaim": {"claimName": "w"}}},
        "engine": {"gpus": 1},
        "speculation": {
            "method": "draft",
            "draft": "llama-1b",
            "draftVolume": {"persistentVolumeClaim": {"claimName": "w"}},
        },
    }
)


def pod_of(spec: SpecDeploymentSpec, **kwargs: object) -> dict:
    config = render.engine_config(spec, 12, 2)
    return render.deployment("llm", "ns", spec, config, **kwargs)["spec"]["template"]


def test_weights_from_volumes_are_mounted_read_only_and_read_there() -> None:
    config = render.engine_config(CLAIMED, 12, 2)
    assert config["model"] == "/weights/model/llama/8b"
    assert ServeSettings.model_validate(config).model_id == "llama/8b"
    assert config["draft"] == "/weights/draft/llama-1b"
    pod = pod_of(CLAIMED)["spec"]
    container = pod["containers"][0]
    volumes = {v["name"]: v for v in pod["volumes"]}
    claim = {"claimName": "w", "readOnly": True}
    assert volumes["weights"]["persistentVolumeClaim"] == claim
    assert volumes["draft-weights"]["persistentVolumeClaim"] == claim
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/weights/model"] == {
        "name": "weights",
        "mountPath": "/weights/model",
        "readOnly": True,
    }
    assert mounts["/weights/draft"]["readOnly"] is True
    # the same paths as arguments (a runtime that maps mounts rewrites arguments)
    args = container["args"]
    assert args[args.index("--model") + 1] == config["model"]
    assert args[args.index("--draft") + 1] == config["draft"]


def test_weights_in_the_image_take_no_volume_and_no_argument() -> None:
    pod = pod_of(SPEC)["spec"]
    assert {v["name"] for v in pod["volumes"]} == {"tmp", "cache", "shm", "config", "admin-token"}
    assert "--model" not in pod["containers"][0]["args"]
    assert render.engine_config(SPEC, 12, 2)["model"] == "tiny-target"


def test_a_gpu_pod_asks_the_engine_for_cuda_and_a_cpu_pod_does_not() -> None:
    assert render.engine_config(SPEC, 12, 2)["device"] == "cuda"
    cpu = SpecDeploymentSpec.model_validate({"model": {"name": "tiny-target"}})
    assert "device" not in render.engine_config(cpu, 12, 2)


def test_the_image_defaults_to_the_operators_and_a_spec_image_wins() -> None:
    def image(spec: SpecDeploymentSpec, **kwargs: object) -> str:
        return pod_of(spec, **kwargs)["spec"]["containers"][0]["image"]

    assert image(SPEC) == render.ENGINE_IMAGE
    assert render.ENGINE_IMAGE.startswith("ghcr.io/spectune/spectune-engine:")
    assert image(SPEC, default_image="reg.example/engine:2") == "reg.example/engine:2"
    pinned = changed(engine__image="reg.example/engine:1")
    assert image(pinned, default_image="reg.example/engine:2") == "reg.example/engine:1"


def test_the_default_pod_meets_pod_security_restricted() -> None:
    """The restricted profile's checks (kubernetes.io/docs/concepts/security/pod-security-
    standards); the local API server's admission proves it in test_pod_security.py."""
    pod = pod_of(CLAIMED)["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # issue 61, item 7: no fixed UID, GID or fsGroup, which OpenShift's restricted SCC refuses
    # outside the namespace's range (it assigns one); elsewhere the image's user 10001 runs
    assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(pod["securityContext"])
    security = pod["containers"][0]["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    allowed = {"configMap", "secret", "persistentVolumeClaim", "emptyDir", "projected"}
    assert all(set(v) - {"name"} <= allowed for v in pod["volumes"])


def test_the_engine_runs_on_a_read_only_root_and_writes_to_empty_dirs() -> None:
    """What the engine image writes (its HOME /tmp with the compile caches, /cache, /dev/shm)
    is an emptyDir each; the rest of the root filesystem is read-only."""
    pod = pod_of(CLAIMED)["spec"]
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    for path in ("/tmp", "/cache", "/dev/shm"):
        assert "emptyDir" in volumes[mounts[path]], path
    assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory"}


TEMPLATE = {
    "metadata": {"labels": {"team": "llm"}, "annotations": {"owner": "ml-platform"}},
    "spec": {
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "nodeSelector": {"pool": "gpu"},
        "imagePullSecrets": [{"name": "regcred"}],
        "serviceAccountName": "engines",
        "priorityClassName": "inference",
        "runtimeClassName": "nvidia",
        "securityContext": {"fsGroup": 2000},
        "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
        "containers": [
            {
                "name": "engine",
                "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
                "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
                "resources": {"limits": {"memory": "64Gi"}},
                "securityContext": {"readOnlyRootFilesystem": True},
            }
        ],
    },
}


def test_a_template_is_merged_into_the_pod_and_the_defaults_it_does_not_name_stay() -> None:
    spec = changed(engine__template=TEMPLATE)
    pod = pod_of(spec)
    assert pod["metadata"]["labels"]["team"] == "llm"
    assert pod["metadata"]["labels"]["app.kubernetes.io/instance"] == "llm"
    assert pod["metadata"]["annotations"]["owner"] == "ml-platform"
    assert render.CONFIG_HASH_ANNOTATION in pod["metadata"]["annotations"]
    p = pod["spec"]
    assert p["tolerations"] == TEMPLATE["spec"]["tolerations"]
    # maps merge key by key: the spec's own nodeSelector and the template's
    assert p["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "pool": "gpu"}
    assert p["serviceAccountName"] == "engines" and p["runtimeClassName"] == "nvidia"
    assert p["imagePullSecrets"] == [{"name": "regcred"}]
    assert p["securityContext"] == {**render.POD_SECURITY, "fsGroup": 2000}
    # the template's shm (the same name as the default's) replaces it
    assert [v["name"] for v in p["volumes"]] == ["tmp", "cache", "shm", "config", "admin-token"]
    assert p["volumes"][2] == {"name": "shm", "emptyDir": {"medium": "Memory"}}
    (container,) = p["containers"]
    assert container["env"] == [{"name": "HF_HUB_OFFLINE", "value": "1"}]
    assert {m["mountPath"] for m in container["volumeMounts"]} == {
        "/tmp",
        "/cache",
        "/dev/shm",
        "/etc/spectune",
        "/var/run/spectune",
    }
    assert container["resources"]["limits"] == {"memory": "64Gi", "nvidia.com/gpu": "1"}
    assert container["resources"]["requests"]["cpu"] == "2"
    assert container["securityContext"] == {
        **render.CONTAINER_SECURITY,
        "readOnlyRootFilesystem": True,
    }


def test_a_stopping_engine_keeps_serving_until_endpoints_let_it_go() -> None:
    """Issue 61, item 4: nothing waited for endpoint removal, and the template refused the
    drain and placement fields. By default a preStop sleep outlasts endpoint propagation within
    the grace period; a template sets the grace period, replaces the preStop (not merged into
    it: a handler has one action), spreads the pods and adds init containers."""
    default = pod_of(SPEC)["spec"]
    (container,) = default["containers"]
    assert container["lifecycle"] == {"preStop": {"sleep": {"seconds": render.PRE_STOP_SECONDS}}}
    drain = ServeSettings().drain_timeout_s
    assert render.PRE_STOP_SECONDS + drain < default["terminationGracePeriodSeconds"]
    spread = [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
               "whenUnsatisfiable": "ScheduleAnyway",
               "labelSelector": {"matchLabels": render.selector("llm")}}]  # fmt: skip
    init = [{"name": "fetch", "image": "busybox", "command": ["true"]}]
    hook = {"preStop": {"exec": {"command": ["/bin/sh", "-c", "sleep 25"]}}}
    template = {
        "spec": {
            "terminationGracePeriodSeconds": 120,
            "topologySpreadConstraints": spread,
            "initContainers": init,
            "containers": [{"name": "engine", "lifecycle": hook}],
        }
    }
    pod = pod_of(changed(engine__template=template))["spec"]
    assert pod["terminationGracePeriodSeconds"] == 120
    assert pod["topologySpreadConstraints"] == spread and pod["initContainers"] == init
    assert pod["containers"][0]["lifecycle"] == hook


def test_the_operators_own_fields_win_over_a_template() -> None:
    """The CRD refuses such templates; the renderer would not obey one either."""
    template = {
        "metadata": {"labels": {"app.kubernetes.io/instance": "other"}},
        "spec": {
            "volumes": [{"name": "config", "emptyDir": {}}],
            "containers": [
                {
                    "name": "engine",
                    "image": "evil",
                    "args": ["sh"],
                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                }
            ],
        },
    }
    spec = changed(engine__template=template)  # pydantic checks no CEL rule
    pod = render.deployment("llm", "ns", spec, render.engine_config(spec, 12, 2))["spec"]
    assert pod["selector"]["matchLabels"]["app.kubernetes.io/instance"] == "llm"
    template_out = pod["template"]
    assert template_out["metadata"]["labels"]["app.kubernetes.io/instance"] == "llm"
    (container,) = template_out["spec"]["containers"]
    assert container["image"] == render.ENGINE_IMAGE and container["args"][0] == "serve"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    (config,) = [v for v in template_out["spec"]["volumes"] if v["name"] == "config"]
    assert config == {"name": "config", "configMap": {"name": "llm-engine-config"}}


def test_strategic_merge_merges_named_lists_by_key_and_replaces_others() -> None:
    base = {"env": [{"name": "A", "value": "1"}], "tolerations": [{"key": "a"}], "x": {"y": 1}}
    patch = {"env": [{"name": "A", "value": "2"}, {"name": "B"}], "tolerations": [{"key": "b"}]}
    assert render.strategic_merge(base, patch) == {
        "env": [{"name": "A", "value": "2"}, {"name": "B"}],
        "tolerations": [{"key": "b"}],
        "x": {"y": 1},
    }


@pytest.mark.parametrize(
    ("engine", "strategy"),
    [
        (
            {"gpus": 1},
            {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
        ),
        ({"gpus": 0}, {"type": "RollingUpdate"}),
        (
            {"gpus": 1, "strategy": {"maxSurge": 1}},
            {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 1}},
        ),
        (
            {"gpus": 0, "strategy": {"maxUnavailable": "50%"}},
            {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "50%"}},
        ),
        ({"gpus": 1, "strategy": {"type": "Recreate"}}, {"type": "Recreate"}),
    ],
)
def test_gpu_engines_roll_one_pod_at_a_time_without_a_surge(engine, strategy) -> None:
    """A surge pod on a full GPU pool waits for a GPU for ever, and the rollout with it."""
    spec = SpecDeploymentSpec.model_validate({"model": {"name": "m"}, "engine": engine})
    deployment = render.deployment("x", "ns", spec, render.engine_config(spec, None, 2))
    assert deployment["spec"]["strategy"] == strategy
