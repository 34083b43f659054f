"""Fuzz every operation of the server's own OpenAPI schema: no input may cause a 5xx.

Schemathesis generates the cases; hypothesis drives them (schemathesis' pytest plugin
does not support pytest 9 yet, so each operation's strategy is run here directly)."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from spectune.engine import contract

from .conftest import TOKEN, Served
from .metrics_text import parse, total

EXAMPLES_PER_OPERATION = 40


def test_no_server_errors(server: Served) -> None:
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 8
    headers = {"Authorization": f"Bearer {TOKEN}"}  # reach the admin API's validation too
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(case: schemathesis.Case) -> None:
            if isinstance(case.body, dict) and "model" in case.body:
                case.body["model"] = "tiny-target"  # else every case stops at the 404 for the name
            case.call_and_validate(headers=headers, checks=[not_a_server_error], timeout=60)

        fuzz()
    assert server.get("/healthz").status_code == 200
    served = parse(server.get("/metrics").text)
    assert total(served, contract.REQUESTS, outcome="ok") > 0  # generated cases reached the engine
