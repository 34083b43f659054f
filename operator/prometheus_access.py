"""How the operator reaches a Prometheus that is not open: TLS with a CA and a client
certificate, a bearer token or basic auth, and extra headers (Thanos Querier or OpenShift's
Prometheus behind a token, Grafana Mimir's `X-Scope-OrgID`, a managed Prometheus behind its
proxy). Credentials are files (Secrets mounted by the chart), read at each request, so that a
rotated Secret or a refreshed ServiceAccount token is used without a restart; no credential
and no header value is ever logged (`describe` names only what is used).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import requests
from requests.auth import AuthBase, HTTPBasicAuth


@dataclass(frozen=True)
class PrometheusAccess:
    """Everything but the URL. Empty: an open Prometheus over plain HTTP or public TLS."""

    bearer_token_file: str | None = None
    basic_auth_user: str | None = None
    basic_auth_password_file: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    headers: tuple[tuple[str, str], ...] = ()

    def problems(self) -> list[str]:
        """What makes these options unusable, one readable line each (the CLI refuses them)."""
        out = []
        if self.bearer_token_file and (self.basic_auth_user or self.basic_auth_password_file):
            out.append("a bearer token and basic auth cannot both be used")
        if bool(self.basic_auth_user) != bool(self.basic_auth_password_file):
            out.append("basic auth needs both a user and a password file")
        if bool(self.cert_file) != bool(self.key_file):
            out.append("a client certificate needs both its certificate and its key file")
        for what, path in self._files():
            if not Path(path).is_file():
                out.append(f"{what} {path}: no such file")
        return out

    def _files(self) -> list[tuple[str, str]]:
        named = (
            ("bearer token file", self.bearer_token_file),
            ("basic auth password file", self.basic_auth_password_file),
            ("CA file", self.ca_file),
            ("client certificate file", self.cert_file),
            ("client key file", self.key_file),
        )
        return [(what, path) for what, path in named if path]

    def auth(self) -> AuthBase | None:
        """The Authorization header's source, read from its file at each request."""
        if self.bearer_token_file:
            return BearerTokenFile(self.bearer_token_file)
        if self.basic_auth_user and self.basic_auth_password_file:
            return BasicAuthFile(self.basic_auth_user, self.basic_auth_password_file)
        return None

    def session(self) -> requests.Session:
        """A session that verifies the server with the CA given (else the system's) and
        presents the client certificate, if any."""
        session = requests.Session()
        if self.ca_file:
            session.verify = self.ca_file
        if self.cert_file and self.key_file:
            session.cert = (self.cert_file, self.key_file)
        return session

    def describe(self) -> str:
        """What is used, for the log: never a credential or a header's value."""
        parts = [f"{what} {path}" for what, path in self._files()]
        if self.basic_auth_user:
            parts.append(f"basic auth as {self.basic_auth_user}")
        if self.headers:
            parts.append("headers " + ",".join(name for name, _ in self.headers))
        return "; ".join(parts) or "no credentials"


# An open Prometheus: no TLS options, no credentials, no headers.
OPEN = PrometheusAccess()


class BearerTokenFile(AuthBase):
    """`Authorization: Bearer <the file's content>`, read at each request."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        r.headers["Authorization"] = f"Bearer {Path(self.path).read_text().strip()}"
        return r


class BasicAuthFile(AuthBase):
    """Basic auth with the password read from its file at each request."""

    def __init__(self, user: str, password_file: str) -> None:
        self.user, self.password_file = user, password_file

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        password = Path(self.password_file).read_text().rstrip("\n")
        return HTTPBasicAuth(self.user, password)(r)
