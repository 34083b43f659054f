"""Bad requests get a 4xx with an OpenAI-style error, never a 5xx; the server keeps serving."""

from __future__ import annotations

import json

import httpx
import pytest

from spectune.engine import contract

from .metrics_text import parse, total
from .support import Served

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
        # unknown fields are refused as unsupported parameters are, unless they ask for nothing
        (OK | {"response_format": {"type": "json_object"}}, 400, "'response_format'"),
        (OK | {"guided_json": {"type": "object"}}, 400, "'guided_json'"),
        ({"prompt": "x"}, 400, "model"),
        ({"model": "tiny-target"}, 400, "prompt"),
    ],
)
def test_completion_parameters(server: Served, body: dict, status: int, says: str) -> None:
    assert says in error(server.post("/v1/completions", json=body), status)


def test_unknown_fields_that_ask_for_nothing_are_accepted(server: Served) -> None:
    body = OK | {"response_format": {"type": "text"}, "metadata": None, "tools": []}
    assert server.post("/v1/completions", json=body).status_code == 200


def test_chat_parameters(server: Served) -> None:
    base = {
        "model": "tiny-target",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
    }
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    refused = error(server.post("/v1/chat/completions", json=base | {"tools": [tool]}), 400)
    assert "'tools'" in refused  # not silently answered without tools
    no_tools = server.post("/v1/chat/completions", json=base | {"tool_choice": "none"})
    assert no_tools.status_code == 200
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


def post_json_text(server: Served, path: str, body: dict) -> httpx.Response:
    """Send `body` as ASCII JSON, so lone surrogates travel as `\\ud800` escapes (valid JSON)
    where a UTF-8 encoder would fail on them."""
    headers = {"content-type": "application/json"}
    return server.post(path, content=json.dumps(body).encode(), headers=headers)


CHAT = {"model": "tiny-target", "max_tokens": 4}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", OK | {"prompt": "\ud800 abc"}, "prompt"),
        ("/v1/completions", OK | {"prompt": ["fine", "abc \udfff"]}, "prompt"),
        ("/v1/completions", OK | {"stop": "\udc00"}, "stop"),
        ("/v1/completions", OK | {"stop": ["a", "\ud800b"]}, "stop"),
        (
            "/v1/chat/completions",
            CHAT | {"messages": [{"role": "user", "content": "\ud83d hi"}]},
            "messages[0].content",
        ),
        (
            "/v1/chat/completions",
            CHAT
            | {
                "messages": [
                    {"role": "system", "content": "fine"},
                    {"role": "user", "content": [{"type": "text", "text": "x\udbff"}]},
                ]
            },
            "messages[1].content",
        ),
        (
            "/v1/chat/completions",
            CHAT | {"messages": [{"role": "user", "content": "hi"}], "stop": ["\ud800"]},
            "stop",
        ),
    ],
)
def test_lone_surrogates_are_refused_naming_the_field(
    server: Served, path: str, body: dict, param: str
) -> None:
    response = post_json_text(server, path, body)
    assert "lone surrogate" in error(response, 400)
    assert response.json()["error"]["param"] == param


def test_content_parts_other_than_text_are_refused_by_type(server: Served) -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    parts = [{"type": "text", "text": "what is this?"}, image]
    response = server.post(
        "/v1/chat/completions", json=CHAT | {"messages": [{"role": "user", "content": parts}]}
    )
    assert "'image_url'" in error(response, 400)
    assert response.json()["error"]["param"] == "messages[0].content"


def test_streaming_takes_one_prompt(server: Served) -> None:
    response = server.post("/v1/completions", json=OK | {"prompt": ["a", "b"], "stream": True})
    assert "one prompt" in error(response, 400)
    assert response.json()["error"]["param"] == "prompt"


def test_a_list_with_one_refused_prompt_is_refused_whole(server: Served) -> None:
    before = invalid_count(server)
    long = OK | {"max_tokens": 200, "ignore_eos": True}  # still running when refused
    response = server.post("/v1/completions", json=long | {"prompt": ["x = ", "y = ", ""]})
    assert "empty" in error(response, 400)
    # one per prompt: the two queued before the refusal are withdrawn and count as invalid too
    assert invalid_count(server) - before == 3
    assert server.get("/admin/speculation").json()["running"] == 0


def invalid_count(server: Served) -> float:
    return total(parse(server.get("/metrics").text), contract.REQUESTS, outcome="invalid")


def test_refused_requests_count_as_invalid(server: Served) -> None:
    headers = {"content-type": "application/json"}
    refusals = [
        lambda: server.post("/v1/completions", json=OK | {"temperature": 5}),
        lambda: server.post("/v1/completions", json=OK | {"n": 2}),
        lambda: server.post("/v1/completions", json=OK | {"prompt": "x" * 400}),
        lambda: server.post("/v1/completions", json=OK | {"model": "gpt-4"}),
        lambda: server.post("/v1/completions", content=b"{not json", headers=headers),
        lambda: server.post("/v1/completions", content=b"\xff\xfe", headers=headers),
        lambda: server.post("/v1/completions", json=OK | {"prompt": "x" * (2 << 20)}),
        lambda: server.post("/v1/chat/completions", json=CHAT | {"messages": []}),
        lambda: post_json_text(server, "/v1/completions", OK | {"prompt": "\ud800"}),
    ]
    before = invalid_count(server)
    for refuse in refusals:
        assert 400 <= refuse().status_code < 500
    # neither answers nor refusals outside the inference API count
    assert server.post("/v1/completions", json=OK).status_code == 200
    assert server.get("/v1/nothing").status_code == 404
    assert server.put_admin({"k": 0}).status_code == 422
    assert invalid_count(server) - before == len(refusals)
