"""Issue 61, item 8: a Prometheus that is not open, read through the operator's access flags.
The real Prometheus with its own web config (TLS, client certificates required, basic auth),
and a header-checking proxy for a bearer token and Mimir's `X-Scope-OrgID`. With a wrong
password the SpecDeployment is Degraded with the reason, and nothing explores (metrics first);
with the right credentials its engines are measured."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tests.cluster.support import Cluster
from tests.support.waiting import wait_until

from .e2e import speculation, urls
from .secured_prometheus import USER, HeaderProxy, make_pki, secured_prometheus
from .support import (
    AUTO,
    RULES,
    all_ready,
    create,
    delete_specdeployments,
    sd_condition,
    specdeployment,
    start_operator,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NAME = "hosted"
BASE_EXPLORATION = 0.02  # tuning.explorationPercent's default, as a share


def run_operator(cluster: Cluster, admin: client.ApiClient, tmp: Path, ns: str, *flags: str):
    """An operator watching `ns` that reads Prometheus as `flags` say."""
    tmp.mkdir()
    extra = ["--namespace", ns, *flags]
    return start_operator(cluster, admin, tmp, yaml.safe_load(RULES.read_text()), 180, extra=extra)


def test_a_prometheus_behind_tls_basic_auth_or_a_token_is_read(
    cluster: Cluster, admin: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path)
    (tmp_path / "password").write_text("right-horse\n")
    (tmp_path / "wrong").write_text("wrong-horse\n")
    (tmp_path / "token").write_text("t0k3n\n")
    with secured_prometheus(tmp_path, pki, "right-horse") as url:
        tls = [f"--prometheus-url={url}", f"--prometheus-ca-file={pki.ca}",
               f"--prometheus-cert-file={pki.client[0]}",
               f"--prometheus-key-file={pki.client[1]}",
               f"--prometheus-basic-auth-user={USER}"]  # fmt: skip
        create(admin, namespace, specdeployment(NAME, AUTO))

        # A wrong password: Degraded, says why, and the fresh SpecDeployment never explores.
        wrong = run_operator(
            cluster, admin, tmp_path / "wrong-op", namespace, *tls,
            f"--prometheus-basic-auth-password-file={tmp_path / 'wrong'}",
        )  # fmt: skip
        try:
            pods = wait_until("1 ready engine", lambda: all_ready(admin, namespace, NAME, 1), 120)
            (engine,) = urls(pods)
            degraded = wait_until(
                "Degraded for Prometheus",
                lambda: (
                    (c := sd_condition(admin, namespace, NAME, "Degraded")).get("status") == "True"
                    and c
                ),
                timeout=90,
            )
            assert degraded["reason"] == "PrometheusUnavailable", degraded
            assert "401" in degraded["message"], degraded
            shares = []
            for _ in range(4):  # two turns and more: nothing explores
                shares.append(speculation(engine)["effective_exploration"])
                time.sleep(5)
            assert max(shares) == pytest.approx(BASE_EXPLORATION), shares
            assert sd_condition(admin, namespace, NAME, "Calibrated")["reason"] == "NotMeasured"
            log = wrong.log.read_text()
            assert "wrong-horse" not in log and "right-horse" not in log
        finally:
            wrong.stop()

        # The right password, the CA and the client certificate: the engines are measured.
        right = run_operator(
            cluster, admin, tmp_path / "right-op", namespace, *tls,
            f"--prometheus-basic-auth-password-file={tmp_path / 'password'}",
        )  # fmt: skip
        try:
            wait_until(
                "MetricsAvailable through TLS and basic auth",
                lambda: (
                    sd_condition(admin, namespace, NAME, "MetricsAvailable").get("status") == "True"
                ),
                timeout=120,
            )
            wait_until(
                "not Degraded",
                lambda: sd_condition(admin, namespace, NAME, "Degraded").get("status") == "False",
                timeout=60,
            )
        finally:
            right.stop()

    # A bearer token and a tenant header through a proxy that checks both.
    proxy = HeaderProxy(
        cluster.prometheus_url, {"Authorization": "Bearer t0k3n", "X-Scope-OrgID": "team-a"}
    )
    tokened = run_operator(
        cluster, admin, tmp_path / "token-op", namespace,
        f"--prometheus-url={proxy.url}", f"--prometheus-bearer-token-file={tmp_path / 'token'}",
        "--prometheus-header=X-Scope-OrgID=team-a",
    )  # fmt: skip
    try:
        wait_until("the proxy let 20 requests through", lambda: proxy.passed >= 20, timeout=90)
        assert proxy.refused == []
        assert sd_condition(admin, namespace, NAME, "MetricsAvailable")["status"] == "True"
        assert sd_condition(admin, namespace, NAME, "Degraded")["status"] == "False"
        assert "t0k3n" not in tokened.log.read_text() and "team-a" not in tokened.log.read_text()
        delete_specdeployments(admin, namespace)
    finally:
        tokened.stop()
        proxy.close()
