"""Bad requests get a 4xx with an OpenAI-style error, never a 5xx; the server keeps serving."""

from __future__ import annotations

import httpx
import pytest

from .conftest import Served

OK = {"model": "tiny-target", "prompt": "x = ", "max_tokens": 4}


def error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert body["type"] and body["message"]
    return body["message"]


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (OK | {"model": "gpt-4"}, 404, "does not exist"),
        (OK | {"max_tokens": 0}, 400, "max_tokens"),
        (OK | {"max_tokens": 10_000}, 400, "context length"),
        (OK | {"max_tokens": "many"}, 400, "max_tokens"),
        (OK | {"temperature": 5}, 400, "temperature"),
        (OK | {"temperature": -1}, 400, "temperature"),
        (OK | {"prompt": "x" * 400}, 400, "context"),
        (OK | {"prompt": ""}, 400, "empty"),
        (OK | {"prompt": [1, 2, 99999]}, 400, "token ids"),
        (OK | {"n": 2}, 400, "'n'"),
        (OK | {"logprobs": 2}, 400, "logprobs"),
        (OK | {"top_p": 0.5}, 400, "top_p"),
        (OK | {"stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
        ({"prompt": "x"}, 400, "model"),
        ({"model": "tiny-target"}, 400, "prompt"),
    ],
)
def test_completion_parameters(server: Served, body: dict, status: int, says: str) -> None:
    assert says in error(server.post("/v1/completions", json=body), status)


def test_chat_parameters(server: Served) -> None:
    base = {
        "model": "tiny-target",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
    }
    assert "messages" in error(
        server.post("/v1/chat/completions", json=base | {"messages": []}), 400
    )
    bad_role = base | {"messages": [{"role": "wizard", "content": "hi"}]}
    assert "role" in error(server.post("/v1/chat/completions", json=bad_role), 400)
    assert "logprobs" in error(
        server.post("/v1/chat/completions", json=base | {"logprobs": True}), 400
    )


def test_malformed_json_and_wrong_content(server: Served) -> None:
    headers = {"content-type": "application/json"}
    error(server.post("/v1/completions", content=b"{not json", headers=headers), 400)
    error(server.post("/v1/completions", content=b"[1, 2]", headers=headers), 400)
    error(server.post("/v1/completions", content=b"\xff\xfe", headers=headers), 400)


def test_oversized_body(server: Served) -> None:
    big = OK | {"prompt": "x" * (2 << 20)}
    assert "over" in error(server.post("/v1/completions", json=big), 413)


def test_unknown_route_and_method(server: Served) -> None:
    error(server.get("/v1/nothing"), 404)
    error(server.get("/v1/completions"), 405)


def test_still_serving_after_bad_input(server: Served) -> None:
    response = server.post("/v1/completions", json=OK)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] >= 1
