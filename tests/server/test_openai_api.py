"""The official `openai` client against our server: completions, chat, streaming, usage."""

from __future__ import annotations

import time

import pytest
from openai import OpenAI

from .support import Served


@pytest.fixture(scope="module")
def client(server: Served) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model_and_its_context_length(client: OpenAI) -> None:
    """max_model_len as vLLM reports it: what a load generator fits its requests into."""
    (card,) = client.models.list().data
    assert (card.id, card.max_model_len) == ("tiny-target", 256)


def test_completion_with_usage(client: OpenAI) -> None:
    out = client.completions.create(
        model="tiny-target", prompt="def add(a, b):", max_tokens=12, temperature=0
    )
    assert out.object == "text_completion" and out.choices[0].finish_reason == "length"
    assert out.usage.prompt_tokens == len(b"def add(a, b):") and out.usage.completion_tokens == 12
    assert out.usage.total_tokens == out.usage.prompt_tokens + 12
    again = client.completions.create(
        model="tiny-target", prompt="def add(a, b):", max_tokens=12, temperature=0
    )
    assert again.choices[0].text == out.choices[0].text  # greedy is deterministic


def test_chat_completion_with_usage(client: OpenAI) -> None:
    out = client.chat.completions.create(
        model="tiny-target",
        messages=[
            {"role": "system", "content": "You write Python."},
            {"role": "user", "content": "a loop"},
        ],
        max_tokens=10,
        temperature=0.7,
        seed=3,
    )
    assert out.choices[0].message.role == "assistant"
    assert isinstance(out.choices[0].message.content, str)
    assert out.usage.completion_tokens == 10 and out.usage.prompt_tokens > 20


def test_streaming_delivers_tokens_incrementally(client: OpenAI) -> None:
    arrivals, pieces = [], []
    stream = client.completions.create(
        model="tiny-target",
        prompt="class A:\n",
        max_tokens=60,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    usage = None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].text:
            arrivals.append(time.monotonic())
            pieces.append(chunk.choices[0].text)
    assert len(pieces) >= 5  # many chunks, not one at the end
    assert arrivals[-1] - arrivals[0] > 0.01
    assert usage is not None and usage.completion_tokens == 60
    whole = client.completions.create(
        model="tiny-target", prompt="class A:\n", max_tokens=60, temperature=0
    )
    assert "".join(pieces) == whole.choices[0].text


def test_chat_streaming(client: OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="tiny-target",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=20,
            temperature=0,
            stream=True,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    assert sum(len(c.choices[0].delta.content or "") for c in chunks) > 0


def test_stop_string_ends_the_completion(client: OpenAI) -> None:
    full = client.completions.create(
        model="tiny-target", prompt="import os\n", max_tokens=40, temperature=0
    )
    text = full.choices[0].text
    stop = text[5:7]
    assert stop, "the model produced too little text to pick a stop string"
    cut = client.completions.create(
        model="tiny-target", prompt="import os\n", max_tokens=40, temperature=0, stop=[stop]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(stop)]


def test_completion_with_a_list_of_prompts(client: OpenAI) -> None:
    prompts = ["def add(a, b):", "import os\n", "class A:\n"]
    out = client.completions.create(
        model="tiny-target",
        prompt=prompts,
        max_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert all(c.finish_reason == "length" for c in out.choices)
    assert out.usage.prompt_tokens == sum(len(p.encode()) for p in prompts)
    assert out.usage.completion_tokens == 3 * 6
    for prompt, choice in zip(prompts, out.choices, strict=True):
        alone = client.completions.create(
            model="tiny-target",
            prompt=prompt,
            max_tokens=6,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        assert choice.text == alone.choices[0].text  # each choice answers its own prompt
    ids = client.completions.create(model="tiny-target", prompt=[[10, 11], [12]], max_tokens=2)
    assert len(ids.choices) == 2 and ids.usage.prompt_tokens == 3


def test_chat_with_text_content_parts(client: OpenAI) -> None:
    def answer(content: str | list[dict[str, str]]) -> str:
        out = client.chat.completions.create(
            model="tiny-target",
            messages=[{"role": "user", "content": content}],
            max_tokens=8,
            temperature=0,
        )
        return out.choices[0].message.content

    parts = [{"type": "text", "text": "a loop"}, {"type": "text", "text": "in Python"}]
    assert answer(parts) == answer("a loop\nin Python")  # text parts joined by newlines
