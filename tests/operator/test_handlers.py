"""The kopf handlers' own rules, at their seams to the API server: a child the API server
refuses keeps neither the other children nor the engines' push from happening, and a child
is applied only when it is due."""

from __future__ import annotations

import copy

from kubernetes.client.exceptions import ApiException

from spectune.operator import applying, handlers, render

from .machine import spec


def refused(status: int, message: str) -> ApiException:
    err = ApiException(status=status, reason="Forbidden")
    err.body = f'{{"kind": "Status", "message": "{message}"}}'
    return err


def owned() -> list[dict]:
    return handlers.children("llm", "ns", spec(), render.engine_config(spec(), 8, 2))


def test_a_refused_child_is_said_and_the_others_are_still_applied(monkeypatch) -> None:
    """Issue 59, K: the first child the API server refused raised out of the turn, so the
    children after it were not applied and no engine was pushed to."""
    applied: list[str] = []

    def apply(body: dict, child: dict) -> dict:
        if child["kind"] == "Deployment":
            raise refused(403, "deployments.apps is forbidden: exceeded quota")
        applied.append(child["kind"])
        return child | {"metadata": child["metadata"] | {"resourceVersion": "7"}}

    monkeypatch.setattr(handlers, "_apply_child", apply)
    books: dict = {}
    error = handlers.apply_children({"metadata": {"name": "llm"}}, owned(), books, {}, 0.0)
    assert applied == ["ConfigMap", "Service"]
    assert error == applying.Refusal(
        "ApplyFailed", "Deployment llm: deployments.apps is forbidden: exceeded quota"
    )
    assert set(books) == {("ConfigMap", "llm-engine-config"), ("Service", "llm")}


def test_someone_elses_object_is_left_alone_and_named(monkeypatch) -> None:
    """Issue 61, item 6: a forced apply and kopf.adopt took over a user's Deployment of the
    SpecDeployment's name (and garbage collection deleted it with the SpecDeployment). Now
    it is not applied, the others are, and the refusal names it with reason NotOwned."""
    users = {"name": "llm", "resourceVersion": "5", "labels": {"app": "mine"}}
    applied: list[str] = []

    def live(child: dict) -> dict | None:
        return users if child["kind"] == "Deployment" else None

    def apply(child: dict) -> dict:
        applied.append(child["kind"])
        return child | {"metadata": child["metadata"] | {"resourceVersion": "7"}}

    monkeypatch.setattr(handlers.kube, "live_metadata", live)
    monkeypatch.setattr(handlers.kube, "apply", apply)
    monkeypatch.setattr(handlers.kopf, "info", lambda *a, **k: None)
    body = {"apiVersion": "spectune.io/v1alpha1", "kind": "SpecDeployment"}
    body["metadata"] = {"name": "llm", "namespace": "ns", "uid": "u-1"}
    error = handlers.apply_children(body, owned(), {}, {}, 0.0)
    assert applied == ["ConfigMap", "Service"]
    assert error is not None and error.reason == "NotOwned"
    assert error.message.startswith("Deployment llm exists and was not made by this")


def test_a_child_is_applied_only_when_its_content_or_the_live_object_moved(monkeypatch) -> None:
    """Issue 59, J: every turn read and force-applied every child. Now a turn applies what
    it rendered differently, what someone else changed (the watch shows another identity), or
    what no watch covers once every REPAIR_SECONDS."""
    sent: list[str] = []
    versions = iter(range(100, 200))

    def apply(body: dict, child: dict) -> dict:
        sent.append(child["kind"])
        child["metadata"]["ownerReferences"] = [{"name": "llm"}]  # as kopf.adopt does
        meta = child["metadata"] | {"resourceVersion": str(next(versions)), "generation": 3}
        return child | {"metadata": meta}

    monkeypatch.setattr(handlers, "_apply_child", apply)
    body, books = {"metadata": {"name": "llm"}}, {}
    monitor = {"kind": "PodMonitor", "metadata": {"name": "llm"}, "spec": {}}

    def turn(live: dict, at: float, threshold: int = 8) -> list[str]:
        """One turn's apply of freshly rendered children (as a turn renders them)."""
        sent.clear()
        config = render.engine_config(spec(), threshold, 2)
        rendered = [*handlers.children("llm", "ns", spec(), config), copy.deepcopy(monitor)]
        assert handlers.apply_children(body, rendered, books, live, at) is None
        return list(sent)

    assert turn({}, 0.0) == ["ConfigMap", "Deployment", "Service", "PodMonitor"]
    live = {key: a.identity for key, a in books.items()}
    assert turn(live, 10.0) == []  # nothing moved
    edited = live | {("Deployment", "llm"): "4"}  # a kubectl edit bumped its generation
    assert turn(edited, 20.0) == ["Deployment"]
    assert turn(live, 30.0, threshold=12) == ["ConfigMap"]
    assert "PodMonitor" in turn(live, applying.REPAIR_SECONDS + 1)  # no watch: on a timer
