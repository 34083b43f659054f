"""Text at the API boundary: incremental detokenization, stop strings, chat templates."""

from __future__ import annotations

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

# Used when the checkpoint's tokenizer_config.json has no chat_template (documented in README).
DEFAULT_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


class TemplateError(ValueError):
    """The chat template failed to render these messages."""


def _raise_exception(message: str) -> None:
    """What HF chat templates call to refuse messages (e.g. roles that do not alternate)."""
    raise TemplateError(f"chat template refused the messages: {message}")


def render_chat(template: str | None, messages: list[dict[str, str]], eos_token: str = "") -> str:
    """`messages` through the checkpoint's chat template (None: DEFAULT_CHAT_TEMPLATE), with
    the variables transformers' apply_chat_template gives. `bos_token` is empty: the prompt
    is encoded like a completion's, and the tokenizer adds its BOS where it has one, which a
    BOS from the template would double."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = _raise_exception
    try:
        return env.from_string(template or DEFAULT_CHAT_TEMPLATE).render(
            messages=messages, add_generation_prompt=True, bos_token="", eos_token=eos_token
        )
    except jinja2.TemplateError as err:
        raise TemplateError(f"chat template failed: {err}") from err


class IncrementalText:
    """Decodes a growing token list to text, releasing only complete characters and
    holding back what could still become a stop string."""

    def __init__(self, tokenizer: Tokenizer, stops: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stops = stops
        self.ids: list[int] = []
        self.emitted = 0  # characters of the decoded text already released
        self.stopped = False

    def push(self, tokens: list[int], final: bool) -> str:
        """Add tokens; return the newly releasable text. After a stop string, nothing more."""
        self.ids.extend(tokens)
        text = self.tokenizer.decode(self.ids)
        for stop in self.stops:
            at = text.find(stop, max(0, self.emitted - len(stop)))
            if at != -1:
                self.stopped = True
                return self._release(text, at)
        if final:
            return self._release(text, len(text))
        end = (
            len(text) - 1 if text.endswith("\ufffd") else len(text)
        )  # a character still incomplete
        hold = max((len(s) - 1 for s in self.stops), default=0)
        return self._release(text, max(self.emitted, end - hold))

    def _release(self, text: str, end: int) -> str:
        out = text[self.emitted : end]
        self.emitted = max(self.emitted, end)
        return out
