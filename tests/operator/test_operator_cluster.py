"""The operator against the real local API server and the real engines behind its pods
(the pod runner): create, scale, drift repair, GC, admission of invalid specs, printer columns,
readiness from the engines themselves, which changes roll the pods and which do not, and a log
that stays quiet about resyncs."""

from __future__ import annotations

import json
import os
import re
import time
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from spectune.operator import render
from spectune.operator.models import GROUP, PLURAL, VERSION
from tests.cluster.support import load_script
from tests.support.waiting import wait_until

from .support import (
    OPERATOR_NS,
    all_ready,
    assert_engines_serve,
    create,
    engine_get,
    get_or_none,
    get_sd,
    kubectl,
    patch_sd,
    ready_pods,
    sd_condition,
    specdeployment,
)

pytestmark = pytest.mark.cluster
audit = load_script("audit")  # hack/audit.py: the API server's audit log
CLAIM = {"persistentVolumeClaim": {"claimName": "w"}}


def template(**pod_spec: Any) -> dict[str, Any]:
    """SpecDeployment fields with a pod template of `pod_spec`."""
    return {"engine": {"template": {"spec": pod_spec}}}


def test_create_gives_children_status_and_events(cluster, admin, operator, namespace) -> None:
    create(admin, namespace, specdeployment("llm"))
    apps, core = client.AppsV1Api(admin), client.CoreV1Api(admin)
    deployment = wait_until(
        "the engine Deployment",
        lambda: get_or_none(apps.read_namespaced_deployment, "llm", namespace),
    )
    assert deployment.spec.replicas == 2
    container = deployment.spec.template.spec.containers[0]
    assert container.resources.limits["nvidia.com/gpu"] == "1"
    assert deployment.metadata.owner_references[0].kind == "SpecDeployment"
    config = core.read_namespaced_config_map("llm-engine-config", namespace)
    assert yaml.safe_load(config.data["engine.yaml"])["speculation"]["threshold"] == 6
    # the children are applied one after another in a turn: the Service may follow a moment later
    service = wait_until(
        "the Service", lambda: get_or_none(core.read_namespaced_service, "llm", namespace)
    )
    assert service.metadata.owner_references
    assert core.read_namespaced_secret("llm-admin-token", namespace).data["admin-token"]

    def ready() -> dict | None:
        status = get_sd(admin, namespace, "llm").get("status", {})
        return status if status.get("readyReplicas") == 2 else None

    status = wait_until("2 ready replicas in status", ready, timeout=180)
    assert status["threshold"]["current"] == 6 and status["threshold"]["source"] == "Spec"
    assert status["selector"].startswith("app.kubernetes.io/name=spectune-engine")
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "True"
    events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=llm").items
    assert any(e.reason == "Created" for e in events)
    pods = ready_pods(admin, namespace, "llm")
    assert len(pods) == 2
    assert_engines_serve(pods, "tiny-target", 6)
    table = kubectl(cluster, "get", "sd", "llm", "-n", namespace)
    header, row = table.splitlines()[:2]
    assert header.split() == [
        "NAME",
        "REPLICAS",
        "READY",
        "THRESHOLD",
        "CROSSOVER",
        "GOODPUT",
        "AGE",
    ]
    assert row.split()[:4] == ["llm", "2", "2", "6"]


def test_scale_and_drift_repair(cluster, admin, operator, namespace) -> None:
    create(admin, namespace, specdeployment("llm"))
    apps, core = client.AppsV1Api(admin), client.CoreV1Api(admin)
    wait_until(
        "the Deployment", lambda: get_or_none(apps.read_namespaced_deployment, "llm", namespace)
    )
    kubectl(cluster, "scale", "sd/llm", "--replicas", "3", "-n", namespace)
    wait_until(
        "3 replicas", lambda: apps.read_namespaced_deployment("llm", namespace).spec.replicas == 3
    )

    apps.patch_namespaced_deployment("llm", namespace, {"spec": {"replicas": 7}})
    wait_until(
        "replicas repaired to 3",
        lambda: apps.read_namespaced_deployment("llm", namespace).spec.replicas == 3,
    )
    core.delete_namespaced_config_map("llm-engine-config", namespace)
    wait_until(
        "the ConfigMap recreated",
        lambda: get_or_none(core.read_namespaced_config_map, "llm-engine-config", namespace),
    )


def test_delete_garbage_collects_children(admin, operator, namespace) -> None:
    create(admin, namespace, specdeployment("llm"))
    apps = client.AppsV1Api(admin)
    wait_until(
        "the Deployment", lambda: get_or_none(apps.read_namespaced_deployment, "llm", namespace)
    )
    client.CustomObjectsApi(admin).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "llm"
    )
    wait_until(
        "the Deployment garbage-collected",
        lambda: get_or_none(apps.read_namespaced_deployment, "llm", namespace) is None,
        timeout=120,
    )
    wait_until(
        "the ConfigMap garbage-collected",
        lambda: (
            get_or_none(
                client.CoreV1Api(admin).read_namespaced_config_map, "llm-engine-config", namespace
            )
            is None
        ),
    )


def test_a_users_deployment_of_its_name_is_left_alone(admin, operator, namespace) -> None:
    """Issue 61, item 6: a forced apply and an owner reference took over a user's Deployment
    of the SpecDeployment's name, and deleting the SpecDeployment deleted it. Now it is left
    as it was, the SpecDeployment says why (Degraded NotOwned, a warning Event), its other
    children are made, and deleting it leaves the user's Deployment."""
    apps, core = client.AppsV1Api(admin), client.CoreV1Api(admin)
    labels = {"app": "mine"}
    users = {
        "metadata": {"name": "llm", "labels": labels},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "web", "image": "example.org/mine:1"}]},
            },
        },
    }
    before = apps.create_namespaced_deployment(namespace, users)
    create(admin, namespace, specdeployment("llm"))
    degraded = wait_until(
        "Degraded NotOwned",
        lambda: (
            (c := sd_condition(admin, namespace, "llm", "Degraded")).get("reason") == "NotOwned"
            and c
        ),
    )
    assert degraded["status"] == "True"
    assert "Deployment llm exists and was not made by this SpecDeployment" in degraded["message"]
    wait_until(
        "the ConfigMap made all the same",
        lambda: get_or_none(core.read_namespaced_config_map, "llm-engine-config", namespace),
    )
    events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=llm").items
    warned = [e for e in events if e.reason == "NotOwned"]
    assert warned and warned[0].type == "Warning" and "left alone" in warned[0].message
    live = apps.read_namespaced_deployment("llm", namespace)
    assert live.metadata.owner_references is None
    assert live.metadata.generation == before.metadata.generation
    assert live.spec.template.spec.containers[0].image == "example.org/mine:1"
    assert "spectune-operator" not in {f.manager for f in live.metadata.managed_fields}

    client.CustomObjectsApi(admin).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "llm"
    )
    wait_until(
        "the ConfigMap garbage-collected",
        lambda: (
            get_or_none(core.read_namespaced_config_map, "llm-engine-config", namespace) is None
        ),
        timeout=120,
    )
    kept = apps.read_namespaced_deployment("llm", namespace)
    assert kept.metadata.uid == before.metadata.uid and kept.metadata.deletion_timestamp is None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"speculation": {"threshold": {"min": 10, "max": 4}}},
            "threshold.min must not exceed threshold.max",
        ),
        ({"speculation": {"numSpeculativeTokens": 0}}, "numSpeculativeTokens"),
        ({"speculation": {"method": "medusa"}}, 'Unsupported value: "medusa"'),
        ({"replicas": -1}, "spec.replicas"),
        ({"slo": {"ttftMilliseconds": 0}}, "ttftMilliseconds"),
        (
            {"speculation": {"method": "draft"}},
            "speculation.draft is required when method is draft",
        ),
        (
            {"speculation": {"threshold": {"mode": "Manual"}}},
            "threshold.value is required in Manual mode",
        ),
        ({"model": {}}, "spec.model.name: Required value"),
        ({"engine": {"gpus": 2}}, "spec.engine.gpus"),
        (
            {"model": {"name": "/abs", "volume": CLAIM}},
            "model.name is the checkpoint's directory inside it",
        ),
        (
            {"model": {"name": "a/../../b", "volume": CLAIM}},
            "a relative path without '..'",
        ),
        ({"speculation": {"draftVolume": CLAIM}}, "speculation.draft is the draft's directory"),
        (template(containers=[{"name": "engine", "image": "x"}]), "the operator sets the engine"),
        (template(containers=[{"name": "sidecar"}]), "only the engine container"),
        (template(volumes=[{"name": "config", "emptyDir": {}}]), "volume names config"),
        (
            template(
                containers=[
                    {
                        "name": "engine",
                        "volumeMounts": [{"mountPath": "/etc/spectune", "name": "x"}],
                    }
                ]
            ),
            "mount paths /etc/spectune",
        ),
        (
            template(
                containers=[{"name": "engine", "resources": {"limits": {"nvidia.com/gpu": 2}}}]
            ),
            "nvidia.com/gpu comes from spec.engine.gpus",
        ),
        (
            {"engine": {"template": {"metadata": {"labels": {"app.kubernetes.io/instance": "x"}}}}},
            "select the engine pods",
        ),
    ],
)
def test_invalid_specdeployments_are_rejected(admin, namespace, spec: dict, message: str) -> None:
    with pytest.raises(ApiException) as err:
        create(admin, namespace, specdeployment("bad", **spec))
    assert err.value.status == 422
    assert message in json.loads(err.value.body)["message"]


def test_engines_that_cannot_start_keep_the_specdeployment_not_ready(
    cluster, admin, operator, namespace
) -> None:
    create(admin, namespace, specdeployment("broken", model={"name": "/models/does-not-exist"}))
    core = client.CoreV1Api(admin)

    def refused() -> list[Any] | None:
        """Both pods Running, and the pod runner has said why their engines are not ready."""
        pods = core.list_namespaced_pod(
            namespace, label_selector=render.selector_string("broken")
        ).items
        said = [
            p
            for p in pods
            if p.status.phase == "Running"
            and any(
                c.type == "Ready" and c.status == "False" and (c.reason or "").startswith("Engine")
                for c in p.status.conditions or []
            )
        ]
        return said if len(said) == 2 else None

    pods = wait_until("the engines' pods to be Running and not Ready", refused, timeout=120)

    def explained() -> dict | None:
        ready = sd_condition(admin, namespace, "broken", "Ready")
        return ready if "no such directory" in ready.get("message", "") else None

    # The engine exits with the reason; the pod runner reports it as the kubelet would.
    ready = wait_until("the SpecDeployment to say why it is not Ready", explained)
    assert ready["status"] == "False" and ready["reason"] == "ReplicasNotReady"
    assert ready["message"].startswith("0/2 engine replicas ready; broken-")
    assert "the engine did not start: model " in ready["message"]
    assert get_sd(admin, namespace, "broken")["status"]["readyReplicas"] == 0
    assert (
        kubectl(cluster, "get", "sd", "broken", "-n", namespace).splitlines()[1].split()[2] == "0"
    )
    assert not any(p.status.container_statuses[0].ready for p in pods)


def test_start_settings_roll_the_pods_and_the_threshold_does_not(
    cluster, admin, operator, namespace
) -> None:
    custom, apps = client.CustomObjectsApi(admin), client.AppsV1Api(admin)
    create(admin, namespace, specdeployment("llm"))
    first = wait_until(
        "2 ready engines", lambda: all_ready(admin, namespace, "llm", 2), timeout=180
    )
    assert_engines_serve(first, "tiny-target", 6)
    started = {p.metadata.uid: engine_get(p, "/v1/models")["data"][0]["created"] for p in first}
    generation = apps.read_namespaced_deployment("llm", namespace).metadata.generation

    # The threshold reloads from the ConfigMap: the same pods, the same engine processes.
    threshold = {"speculation": {"threshold": {"value": 9}}}
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "llm", {"spec": threshold}
    )
    wait_until(
        "the engines to run threshold 9",
        lambda: all(engine_get(p, "/admin/speculation")["threshold"] == 9 for p in first),
        timeout=90,
    )
    assert apps.read_namespaced_deployment("llm", namespace).metadata.generation == generation
    pods = client.CoreV1Api(admin).list_namespaced_pod(
        namespace, label_selector=render.selector_string("llm")
    )
    assert {p.metadata.uid for p in pods.items} == set(started)  # no surge pod either
    same = ready_pods(admin, namespace, "llm")
    assert {
        p.metadata.uid: engine_get(p, "/v1/models")["data"][0]["created"] for p in same
    } == started

    # k is read at start: new pods replace the old ones, and their engines run the new k.
    custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        "llm",
        {"spec": {"speculation": {"numSpeculativeTokens": 3}}},
    )

    def rolled() -> list[Any] | None:
        pods = ready_pods(admin, namespace, "llm")
        fresh = [p for p in pods if p.metadata.uid not in started]
        return fresh if len(pods) == len(fresh) == 2 else None

    replaced = wait_until("the pods to be replaced", rolled, timeout=240)
    assert_engines_serve(replaced, "tiny-target", 9)
    assert all(engine_get(p, "/admin/speculation")["k"] == 3 for p in replaced)


def test_more_specdeployments_than_kopfs_threads_are_each_tuned(admin, operator, namespace) -> None:
    """Each SpecDeployment's daemon holds no thread between its turns: kopf's pool has
    min(32, CPUs + 4) threads, and sync daemons, one per SpecDeployment for its whole life,
    took them all (on 2 cores a seventh was never tuned, nor its spec edits handled). Two
    more than the pool each get their children and a status; a spec edit of the last is acted
    on too."""
    pool = min(32, (os.cpu_count() or 1) + 4)
    names = [f"many-{i}" for i in range(pool + 2)]
    for name in names:
        create(admin, namespace, specdeployment(name, replicas=0))
    core = client.CoreV1Api(admin)

    def tuned() -> bool:
        configs = {c.metadata.name for c in core.list_namespaced_config_map(namespace).items}
        status = [get_sd(admin, namespace, n).get("status") or {} for n in names]
        return all(f"{n}-engine-config" in configs for n in names) and all(
            s.get("observedGeneration") for s in status
        )

    wait_until(f"{len(names)} SpecDeployments tuned", tuned, timeout=90)
    patch_sd(admin, namespace, names[-1], {"tuning": {"maxAgeSeconds": 7200}})

    def edit_acted_on() -> bool:
        body = get_sd(admin, namespace, names[-1])
        observed = (body.get("status") or {}).get("observedGeneration")
        return observed == body["metadata"]["generation"] > 1

    wait_until("the last one's edit acted on", edit_acted_on, timeout=60)


def test_the_log_is_quiet_about_resyncs(admin, operator, namespace) -> None:
    """A turn every 10 s per SpecDeployment and a handler run per spec edit log nothing at
    INFO unless something changed ("Handler 'spec_changed' succeeded." is DEBUG)."""
    create(admin, namespace, specdeployment("quiet", replicas=0))
    core = client.CoreV1Api(admin)
    wait_until(
        "the ConfigMap",
        lambda: get_or_none(core.read_namespaced_config_map, "quiet-engine-config", namespace),
    )
    for tick in ("a resync", "a second resync"):  # only the periodic turn brings it back
        core.delete_namespaced_config_map("quiet-engine-config", namespace)
        wait_until(
            f"the ConfigMap recreated by {tick}",
            lambda: get_or_none(core.read_namespaced_config_map, "quiet-engine-config", namespace),
        )
    patch_sd(admin, namespace, "quiet", {"tuning": {"maxAgeSeconds": 7200}})
    wait_until("the spec edit handled", lambda: "Updating is processed" in operator.read_text())
    log = operator.read_text()
    successes = re.findall(r"^.* INFO kopf\.objects: .*succeeded\.$", log, re.MULTILINE)
    assert successes == []


def test_a_settled_specdeployment_costs_the_api_server_nothing_but_its_watches(
    admin, operator, namespace
) -> None:
    """Issue 59, J: every 10 s turn read the object, its pods and Deployment, created the token
    Secret (a 409), patched status, and read and force-applied every child: some 14 requests a
    turn for nothing. Once a SpecDeployment has settled, its turns make no request of the API
    server but its watches and the Lease (the API server's audit log, over three turns)."""
    create(admin, namespace, specdeployment("steady", replicas=0))
    core = client.CoreV1Api(admin)
    wait_until(
        "the ConfigMap",
        lambda: get_or_none(core.read_namespaced_config_map, "steady-engine-config", namespace),
    )
    wait_until("a status", lambda: get_sd(admin, namespace, "steady").get("status") or None)
    time.sleep(25)  # two more turns: whatever the first ones still had to write
    since = datetime.now(UTC)
    time.sleep(35)  # three turns
    user = audit.service_account(OPERATOR_NS, operator.stem)
    made = [
        f"{c.verb} {c.resource} {c.name} ({c.code})"
        for c in audit.calls()
        if c.user == user and c.at >= since
        and c.verb not in ("watch", "list") and c.resource != "leases"
    ]  # fmt: skip
    assert made == []


def test_pod_monitor_is_rendered_when_the_prometheus_operator_crd_exists(
    cluster, admin, operator, namespace
) -> None:
    """The CRD is the Prometheus Operator's own, which hack/cluster.sh installs. With a
    PodMonitor in use the engine pods carry no scrape annotations: the local Prometheus, which
    scrapes annotated pods, finds them only as engines (its job standing for the PodMonitor),
    so each is scraped once."""
    create(admin, namespace, specdeployment("llm"))
    custom = client.CustomObjectsApi(admin)
    wait_until(
        "the PodMonitor",
        lambda: get_or_none(
            lambda n, ns: custom.get_namespaced_custom_object(
                "monitoring.coreos.com", "v1", ns, "podmonitors", n
            ),
            "llm",
            namespace,
        ),
    )
    pods = wait_until("2 ready engines", lambda: all_ready(admin, namespace, "llm", 2), 120)
    for pod in pods:
        assert not [a for a in pod.metadata.annotations or {} if a.startswith("prometheus.io/")]

    def scraped_once() -> dict[str, list[str]] | None:
        targets = cluster.prometheus("/api/v1/targets", state="active")["activeTargets"]
        pools = {p.metadata.name: [] for p in pods}
        for t in targets:
            if t["labels"].get("namespace") == namespace and t["labels"].get("pod") in pools:
                pools[t["labels"]["pod"]].append(t["scrapePool"])
        return pools if all(pools.values()) else None

    pools = wait_until("the engines scraped", scraped_once, timeout=60)
    assert all(p == ["spectune-engines"] for p in pools.values()), pools
