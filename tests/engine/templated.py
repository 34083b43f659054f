"""A small checkpoint with a chat template of its own, and what that template renders: for the
tests of what load_checkpoint reads and of chat requests against a server on it."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import torch

from spectune.engine.checkpoint import save_checkpoint
from spectune.engine.model import ModelConfig, Transformer
from spectune.engine.zoo.training import EOS_ID, byte_tokenizer

# Unlike the fallback (`<|role|>\ncontent\n`), and uses the variables HF templates use.
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m.role }}]: {{ m.content }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}[assistant]: {% endif %}"
)
MESSAGES = [
    {"role": "system", "content": "You write Python."},
    {"role": "user", "content": "a loop, ünïcode"},
]


def write_checkpoint(path: Path, tokenizer_config: dict | None) -> Path:
    """A small random-weight checkpoint (byte tokenizer), with `tokenizer_config` as its
    tokenizer_config.json when given."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(257, 64, 96, 2, 4, 2, 16, 256)).eval()
    save_checkpoint(model, byte_tokenizer(), path, EOS_ID)
    if tokenizer_config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return path


def expected_prompt(template: str, messages: list[dict[str, str]], eos_token: str) -> str:
    """`template` rendered as HF's apply_chat_template does, independently of the engine."""
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=True, bos_token="", eos_token=eos_token
    )
