"""Chat completions render the checkpoint's own chat_template (tokenizer_config.json)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from openai import OpenAI

from spectune.engine.serving.text import DEFAULT_CHAT_TEMPLATE
from spectune.engine.zoo.training import byte_tokenizer
from tests.engine.templated import MESSAGES, TEMPLATE, expected_prompt, write_checkpoint

from .support import Served, start_server, stop_server


@pytest.fixture(scope="module")
def templated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, str]]:
    """A server for a checkpoint whose tokenizer_config.json has a chat_template; (server,
    model name)."""
    config = {"chat_template": TEMPLATE, "eos_token": "<|endoftext|>"}
    model = str(write_checkpoint(tmp_path_factory.mktemp("templated") / "ckpt", config))
    served = start_server(
        tmp_path_factory.mktemp("server"),
        {"model": model, "method": "none", "max_model_len": 256},
    )
    yield served, model
    stop_server(served)


def test_chat_renders_the_checkpoint_template(templated: tuple[Served, str]) -> None:
    served, model = templated
    client = OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)
    prompt = expected_prompt(TEMPLATE, MESSAGES, "<|endoftext|>")
    fallback = expected_prompt(DEFAULT_CHAT_TEMPLATE, MESSAGES, "")
    tokens, fallback_tokens = (len(byte_tokenizer().encode(p).ids) for p in (prompt, fallback))
    assert tokens != fallback_tokens  # so prompt_tokens tells the two apart
    greedy = {"max_tokens": 16, "temperature": 0, "extra_body": {"ignore_eos": True}}
    chat = client.chat.completions.create(model=model, messages=MESSAGES, **greedy)
    assert chat.usage.prompt_tokens == tokens
    # Greedy on the same token ids: the chat ran exactly on the template's rendering.
    same = client.completions.create(model=model, prompt=prompt, **greedy)
    assert same.usage.prompt_tokens == tokens
    assert chat.choices[0].message.content == same.choices[0].text
