"""`make cluster-down` leaves nothing running, and a warm `make cluster-up` is quick.

Runs after every other test (see conftest.py): it stops the cluster, checks that no process it
started (control plane, kwok, Prometheus, pod runner, engines) is left and that its ports are
closed, then starts it again, so the session ends with the cluster as it found it.
"""

from __future__ import annotations

import socket
import urllib.parse

import pytest

from tests.cluster.support import (
    Cluster,
    cluster_is_up,
    our_processes,
    run_visible,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.cluster


def port_open(url: str) -> bool:
    parsed = urllib.parse.urlsplit(url)
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((parsed.hostname or "", parsed.port or 0)) == 0


def test_down_leaves_no_process_and_warm_up_is_quick(
    cluster: Cluster, request: pytest.FixtureRequest
) -> None:
    before = our_processes()
    assert before, "the cluster is up, so some of its processes must be running"
    urls = [cluster.api_server, cluster.prometheus_url]
    assert all(port_open(u) for u in urls)

    run_visible(request, ["make", "--no-print-directory", "cluster-down"])
    left = our_processes()
    assert left == [], f"left behind: {left}"
    assert not any(port_open(u) for u in urls)

    seconds = run_visible(request, ["make", "--no-print-directory", "cluster-up"])
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print(f"\n[cluster] warm `make cluster-up` to ready: {seconds:.1f} s", flush=True)
    wait_until("the cluster to report ready", cluster_is_up, timeout=30)
