"""The operator's flags without a cluster: target label names from flags, else the
environment, else the reader's defaults, and the exploration lease, handed to the handlers in
kopf's memo."""

from __future__ import annotations

import dataclasses

import kopf
import pytest

from spectune.operator import cli
from spectune.operator.prometheus import LabelNames
from spectune.operator.prometheus_access import PrometheusAccess


def memo(*argv: str) -> kopf.Memo:
    """The memo `spectune-operator run ARGV` would give the handlers (kopf is not run)."""
    return cli.handler_memo(cli.parser().parse_args(["run", *argv]))


def test_the_flags_name_every_label_the_reader_knows() -> None:
    assert tuple(f.name for f in dataclasses.fields(LabelNames)) == cli.LABELS


def test_label_names_default_to_the_readers(monkeypatch: pytest.MonkeyPatch) -> None:
    for target in cli.LABELS:
        monkeypatch.delenv(f"SPECTUNE_PROMETHEUS_{target.upper()}_LABEL", raising=False)
    given = memo("--prometheus-url=http://prom:9090")
    assert given.prometheus_labels == LabelNames()
    assert given.prometheus_url == "http://prom:9090"


def test_label_names_from_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECTUNE_PROMETHEUS_NAMESPACE_LABEL", "kube_namespace")
    monkeypatch.setenv("SPECTUNE_PROMETHEUS_POD_LABEL", "kube_pod")
    given = memo("--prometheus-pod-label=pod_name")
    assert given.prometheus_labels == LabelNames(namespace="kube_namespace", pod="pod_name")


def test_the_exploration_lease_reaches_the_handlers_and_is_refused_below_two_resyncs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert memo().exploration_lease == 60.0
    assert memo("--exploration-lease", "30").exploration_lease == 30.0
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--exploration-lease", "5"])
    assert exit_.value.code == 2
    assert "--exploration-lease: must be between 20 and 86400 seconds, got 5" in (
        capsys.readouterr().err
    )


def test_the_engine_image_flag_reaches_the_handlers_and_is_unset_by_default() -> None:
    """Unset, the handlers run render.ENGINE_IMAGE (the chart always sets the flag)."""
    assert memo().engine_image is None
    assert memo("--engine-image", "reg.example/engine:2").engine_image == "reg.example/engine:2"


def test_prometheus_access_flags_reach_the_reader(tmp_path) -> None:
    """Issue 61, item 8: only an open Prometheus could be read."""
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("t0k3n\n")
    ca.write_text("-")
    given = memo(
        f"--prometheus-bearer-token-file={token}",
        f"--prometheus-ca-file={ca}",
        "--prometheus-header=X-Scope-OrgID=tenant-1",
        "--prometheus-header",
        "X-Extra=a=b",
    )
    access = given.prometheus_access
    assert access.bearer_token_file == str(token) and access.ca_file == str(ca)
    assert access.headers == (("X-Scope-OrgID", "tenant-1"), ("X-Extra", "a=b"))
    assert memo().prometheus_access == PrometheusAccess()


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["--prometheus-bearer-token-file={f}", "--prometheus-basic-auth-user=u",
             "--prometheus-basic-auth-password-file={f}"],
            "a bearer token and basic auth cannot both be used",
        ),
        (["--prometheus-basic-auth-user=u"], "basic auth needs both a user and a password file"),
        (["--prometheus-cert-file={f}"], "a client certificate needs both its certificate"),
        (["--prometheus-ca-file=/no/such/ca.crt"], "CA file /no/such/ca.crt: no such file"),
        (["--prometheus-header=Bad Name=1"], "not a header NAME=VALUE: 'Bad Name'"),
    ],
)  # fmt: skip
def test_unusable_prometheus_access_is_one_readable_line(
    argv: list[str], said: str, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", *(a.format(f=f) for a in argv)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert said in err and err.count("error:") == 1, err
