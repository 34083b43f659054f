"""One writer against the real API server: a status committed from a stale read is refused,
never written over what another writer committed since. No operator runs in this module, so
nothing else writes the object."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from spectune.operator import kube
from spectune.operator.models import GROUP, KIND, VERSION

from .support import create, get_sd, patch_sd, specdeployment

pytestmark = pytest.mark.cluster


@pytest.fixture
def as_admin(admin: client.ApiClient, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The operator's kube module, talking to the local API server as the admin."""
    monkeypatch.setattr(kube, "_make_dynamic", lambda: DynamicClient(admin))
    yield


def test_a_status_commit_from_a_stale_read_is_refused(
    admin: client.ApiClient, namespace: str, as_admin: None
) -> None:
    create(admin, namespace, specdeployment("cas", replicas=0))
    read = kube.get(f"{GROUP}/{VERSION}", KIND, namespace, "cas")
    assert read is not None
    # another writer commits in between (here a spec edit): the read is stale now
    patch_sd(admin, namespace, "cas", {"tuning": {"maxAgeSeconds": 7200}})
    assert not kube.commit_status(read, {"selector": "stale"})
    assert (get_sd(admin, namespace, "cas").get("status") or {}).get("selector") is None
    fresh = kube.get(f"{GROUP}/{VERSION}", KIND, namespace, "cas")
    assert fresh is not None and kube.commit_status(fresh, {"selector": "re-read"})
    assert get_sd(admin, namespace, "cas")["status"]["selector"] == "re-read"
