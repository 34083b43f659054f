"""What load_checkpoint reads besides weights: the chat template and the EOS token text."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spectune.engine.checkpoint import Checkpoint, load_checkpoint
from spectune.engine.serving.text import DEFAULT_CHAT_TEMPLATE, TemplateError, render_chat

from .templated import MESSAGES, TEMPLATE, expected_prompt, write_checkpoint


def _load(path: Path) -> Checkpoint:
    return load_checkpoint(path, "t", torch.device("cpu"), torch.float32)


def test_chat_template_and_eos_token_come_from_tokenizer_config(tmp_path: Path) -> None:
    config = {"chat_template": TEMPLATE, "eos_token": "<|endoftext|>"}
    ckpt = _load(write_checkpoint(tmp_path, config))
    assert ckpt.chat_template == TEMPLATE
    assert ckpt.eos_token == "<|endoftext|>"
    prompt = render_chat(ckpt.chat_template, MESSAGES, eos_token=ckpt.eos_token)
    assert prompt == (
        "[system]: You write Python.<|endoftext|>\n"
        "[user]: a loop, ünïcode<|endoftext|>\n"
        "[assistant]: "
    )
    assert prompt == expected_prompt(TEMPLATE, MESSAGES, "<|endoftext|>")


def test_named_templates_and_added_token_dicts(tmp_path: Path) -> None:
    """The list form of chat_template takes "default"; eos_token may be an AddedToken dict."""
    config = {
        "chat_template": [
            {"name": "tool_use", "template": "tools!"},
            {"name": "default", "template": TEMPLATE},
        ],
        "eos_token": {"content": "<|endoftext|>", "special": True},
    }
    ckpt = _load(write_checkpoint(tmp_path, config))
    assert (ckpt.chat_template, ckpt.eos_token) == (TEMPLATE, "<|endoftext|>")


@pytest.mark.parametrize("config", [None, {"eos_token": "<|endoftext|>"}])
def test_without_a_template_chat_uses_the_documented_fallback(
    tmp_path: Path, config: dict | None
) -> None:
    ckpt = _load(write_checkpoint(tmp_path, config))
    assert ckpt.chat_template is None
    prompt = render_chat(ckpt.chat_template, MESSAGES, eos_token=ckpt.eos_token)
    assert prompt == "<|system|>\nYou write Python.\n<|user|>\na loop, ünïcode\n<|assistant|>\n"
    assert prompt == expected_prompt(DEFAULT_CHAT_TEMPLATE, MESSAGES, "")


def test_a_template_can_refuse_messages_as_hf_templates_do() -> None:
    """raise_exception (which HF templates call) surfaces as TemplateError, a 400 at the API."""
    template = "{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    with pytest.raises(TemplateError, match="user first"):
        render_chat(template, MESSAGES)
