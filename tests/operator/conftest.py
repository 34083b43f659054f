"""Fixtures for the operator against the real local API server (RBAC on): the CRDs served, a
namespace per test, an operator bound to exactly the chart's rules watching it, and a namespace
with a tuning operator of its own. Helpers live in support.py and e2e.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from spectune.operator.models import GROUP, PLURAL, VERSION
from tests.cluster.support import REPO, Cluster
from tests.support.waiting import wait_until

from .support import (
    OPERATOR_NS,
    RULES,
    apply_files,
    delete_specdeployments,
    own_operator,
    start_operator,
)


@pytest.fixture(scope="module")
def admin(cluster: Cluster) -> Iterator[client.ApiClient]:
    api = cluster.api()
    apply_files(cluster, REPO / "crds" / "specdeployments.spectune.io.yaml")
    wait_until("the CRDs to be served", lambda: _served(api))
    try:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": OPERATOR_NS}})
    except ApiException as err:
        assert err.status == 409
    yield api
    api.close()


def _served(api: client.ApiClient) -> bool:
    client.CustomObjectsApi(api).list_cluster_custom_object(GROUP, VERSION, PLURAL)
    return True


@pytest.fixture
def operator(
    cluster: Cluster, admin: client.ApiClient, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Path]:
    """An operator watching the test's namespaces (its `namespace` and `restricted` fixtures',
    whichever it uses): the other lane's tests run beside it (tests/support/lanes.py). Yields
    its log; their SpecDeployments are deleted while it runs, which takes its finalizer off."""
    watched = [
        request.getfixturevalue(f) for f in ("namespace", "restricted") if f in request.fixturenames
    ]
    assert watched, "the operator fixture needs the test's namespace (or restricted) fixture"
    running = start_operator(
        cluster, admin, tmp_path, yaml.safe_load(RULES.read_text()),
        extra=[arg for ns in watched for arg in ("--namespace", ns)],
    )  # fmt: skip
    yield running.log
    try:
        for ns in watched:
            delete_specdeployments(admin, ns)
    finally:
        running.stop()


@pytest.fixture
def namespace(admin: client.ApiClient) -> Iterator[str]:
    name = f"sd-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(admin).create_namespace({"metadata": {"name": name}})
    yield name
    client.CoreV1Api(admin).delete_namespace(name)


@pytest.fixture(scope="module")
def tuner(cluster: Cluster, admin: client.ApiClient, tmp_path_factory) -> Iterator[str]:
    """A namespace watched by an operator of its own, reading the cluster's Prometheus."""
    with own_operator(cluster, admin, tmp_path_factory.mktemp("autotune"), "autotune", 170) as ns:
        yield ns
