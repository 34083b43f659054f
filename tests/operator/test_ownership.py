"""Which live objects a SpecDeployment applies over (`applying.not_owned`): its own, and
spectune's orphans of its name; never another controller's or a user's object."""

from __future__ import annotations

from spectune.operator import render
from spectune.operator.applying import not_owned

OURS = {"uid": "u-1", "kind": "SpecDeployment", "name": "llm", "controller": True}


def meta(**fields: object) -> dict:
    return {"name": "llm", "resourceVersion": "5", **fields}


def test_nothing_there_or_controlled_by_this_specdeployment_is_ours() -> None:
    assert not_owned("Deployment", None, "u-1", "llm") is None
    assert not_owned("Deployment", meta(ownerReferences=[OURS]), "u-1", "llm") is None


def test_a_users_object_of_the_name_is_left_alone() -> None:
    why = not_owned("Deployment", meta(labels={"app": "mine"}), "u-1", "llm")
    assert why is not None and "Deployment llm exists and was not made by this" in why
    # a non-controller reference (a user's own bookkeeping) does not make it ours
    loose = OURS | {"controller": False}
    assert not_owned("Service", meta(ownerReferences=[loose]), "u-1", "llm") is not None


def test_another_controllers_object_is_left_alone_and_the_controller_named() -> None:
    other = {"uid": "u-9", "kind": "Deployment", "name": "helm-app", "controller": True}
    labels = render.labels("llm")  # even with spectune's labels: someone controls it
    why = not_owned("ConfigMap", meta(ownerReferences=[other], labels=labels), "u-1", "llm")
    assert why == "ConfigMap llm exists and is controlled by Deployment helm-app: left alone"
    # a SpecDeployment of the same name deleted and made again: the old one's children wait
    # for the garbage collector, not for a takeover
    old = OURS | {"uid": "u-0"}
    assert not_owned("Deployment", meta(ownerReferences=[old]), "u-1", "llm") is not None


def test_spectunes_orphan_of_this_name_is_taken_back() -> None:
    """`kubectl delete sd --cascade=orphan` then the SpecDeployment again: its children carry
    spectune's labels for this name and no controller, and are applied over."""
    assert not_owned("Deployment", meta(labels=render.labels("llm")), "u-1", "llm") is None
    assert not_owned("Deployment", meta(labels=render.labels("other")), "u-1", "llm") is not None
