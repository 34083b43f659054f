"""Fuzz every operation of the server's own OpenAPI schema: no input may cause a 5xx.

Schemathesis generates the cases; hypothesis drives them (schemathesis' pytest plugin
does not support pytest 9 yet, so each operation's strategy is run here directly).
Schemathesis only generates valid Unicode text, so some cases get lone surrogate escapes
in their strings on top: `"\\ud800"` is valid JSON, but no text a tokenizer can encode."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from spectune.engine import contract

from .metrics_text import parse, total
from .support import TOKEN, Served

EXAMPLES_PER_OPERATION = 40
LONE_SURROGATE = st.characters(categories=["Cs"])


def with_lone_surrogates(value: Any, data: st.DataObject) -> Any:
    """`value` with a lone surrogate put into some of its strings (not the keys)."""
    if isinstance(value, dict):
        return {k: with_lone_surrogates(v, data) for k, v in value.items()}
    if isinstance(value, list):
        return [with_lone_surrogates(v, data) for v in value]
    if isinstance(value, str) and data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(value)))
        return value[:at] + data.draw(LONE_SURROGATE) + value[at:]
    return value


def holds_lone_surrogate(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return True
    return False


@pytest.mark.slow  # 17 s alone with its server's start: make test runs it
def test_no_server_errors(server: Served) -> None:
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 8
    headers = {"Authorization": f"Bearer {TOKEN}"}  # reach the admin API's validation too
    statuses: dict[str, set[int]] = defaultdict(set)
    surrogate_cases = 0
    for operation in operations:
        # invalid bodies too: the only way to reach the validation of those with bounds
        for mode in GenerationMode if len(operation.body) else [GenerationMode.POSITIVE]:

            @given(case=operation.as_strategy(generation_mode=mode), data=st.data())
            @settings(
                max_examples=EXAMPLES_PER_OPERATION // 2,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def fuzz(case: schemathesis.Case, data: st.DataObject) -> None:
                nonlocal surrogate_cases
                if isinstance(case.body, dict) and "model" in case.body:
                    case.body["model"] = "tiny-target"  # else every case stops at the 404
                if isinstance(case.body, dict | list) and data.draw(st.booleans()):
                    # sent here: schemathesis cannot serialize or check such a body itself
                    body = with_lone_surrogates(case.body, data)
                    surrogate_cases += holds_lone_surrogate(body)
                    response = httpx.request(
                        case.method,
                        server.url + case.path,
                        content=json.dumps(body).encode(),  # ASCII: "\\ud800" escapes
                        headers=headers | {"content-type": "application/json"},
                        timeout=60,
                    )
                    assert response.status_code < 500, (body, response.text)
                else:
                    response = case.call_and_validate(
                        headers=headers, checks=[not_a_server_error], timeout=60
                    )
                statuses[case.operation.label].add(response.status_code)

            fuzz()
    assert server.get("/healthz").status_code == 200
    assert surrogate_cases > 0
    # the admin API's body was generated, applied and validated
    assert {200, 422} <= statuses["PUT /admin/speculation"], dict(statuses)
    served = parse(server.get("/metrics").text)
    assert total(served, contract.REQUESTS, outcome="ok") > 0  # generated cases reached the engine
