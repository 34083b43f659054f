"""How the reader authenticates, without a server: credentials read from their files at each
request (a rotated Secret is used without a restart), and a log line that names what is used
and never a credential or a header's value."""

from __future__ import annotations

import base64

import requests

from spectune.operator.prometheus_access import PrometheusAccess


def authorization(access: PrometheusAccess) -> str:
    request = requests.Request("GET", "http://127.0.0.1:1/api/v1/query").prepare()
    auth = access.auth()
    assert auth is not None
    return auth(request).headers["Authorization"]


def test_a_rotated_bearer_token_is_read_at_the_next_request(tmp_path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    access = PrometheusAccess(bearer_token_file=str(token))
    assert authorization(access) == "Bearer first"
    token.write_text("second")
    assert authorization(access) == "Bearer second"


def test_basic_auth_reads_its_password_file_at_each_request(tmp_path) -> None:
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    access = PrometheusAccess(basic_auth_user="spectune", basic_auth_password_file=str(password))
    assert authorization(access) == "Basic " + base64.b64encode(b"spectune:s3cret").decode()
    password.write_text("n3w")
    assert authorization(access) == "Basic " + base64.b64encode(b"spectune:n3w").decode()


def test_the_session_verifies_with_the_ca_and_presents_the_client_certificate() -> None:
    session = PrometheusAccess(ca_file="/ca.crt", cert_file="/c.crt", key_file="/c.key").session()
    assert session.verify == "/ca.crt" and session.cert == ("/c.crt", "/c.key")
    assert PrometheusAccess().session().verify is True  # the system's CAs, never off
    assert PrometheusAccess().auth() is None


def test_the_description_names_no_credential(tmp_path) -> None:
    password = tmp_path / "password"
    password.write_text("s3cret")
    access = PrometheusAccess(
        basic_auth_user="spectune",
        basic_auth_password_file=str(password),
        headers=(("X-Scope-OrgID", "tenant-secret-id"), ("X-Api-Key", "k3y")),
    )
    said = access.describe()
    assert "spectune" in said and "X-Scope-OrgID,X-Api-Key" in said
    assert not any(secret in said for secret in ("s3cret", "tenant-secret-id", "k3y"))
    assert PrometheusAccess().describe() == "no credentials"
