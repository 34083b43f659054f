"""The kopf handlers' own rules, at their seams to the API server: a child the API server
refuses keeps neither the other children nor the engines' push from happening."""

from __future__ import annotations

from kubernetes.client.exceptions import ApiException

from spectune.operator import handlers, render

from .machine import spec


def refused(status: int, message: str) -> ApiException:
    err = ApiException(status=status, reason="Forbidden")
    err.body = f'{{"kind": "Status", "message": "{message}"}}'
    return err


def test_a_refused_child_is_said_and_the_others_are_still_applied(monkeypatch) -> None:
    """Issue 59, K: the first child the API server refused raised out of the turn, so the
    children after it were not applied and no engine was pushed to."""
    applied: list[str] = []

    def apply(body: dict, child: dict) -> dict:
        if child["kind"] == "Deployment":
            raise refused(403, "deployments.apps is forbidden: exceeded quota")
        applied.append(child["kind"])
        return child

    monkeypatch.setattr(handlers, "_apply_child", apply)
    owned = handlers.children("llm", "ns", spec(), render.engine_config(spec(), 8, 2))
    error = handlers.apply_children({"metadata": {"name": "llm"}}, owned)
    assert applied == ["ConfigMap", "Service"]
    assert error == "Deployment llm: deployments.apps is forbidden: exceeded quota"
    monkeypatch.setattr(handlers, "_apply_child", lambda body, child: child)
    assert handlers.apply_children({"metadata": {"name": "llm"}}, owned) is None
