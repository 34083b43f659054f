"""Request and response shapes of the OpenAI-compatible API, and what we refuse.

Parameters the engine does not implement are accepted only at their neutral value
(n = 1, no logprobs, top_p = 1, no penalties, ...); anything else is a 400 that names
the parameter, never a silent ignore. Fields this module does not know (`tools`,
`response_format`, ...) likewise: accepted only when null, false or empty, or at the value that
asks for nothing (`response_format` text, `tool_choice` none).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

MAX_STOP = 4
# Fields we do not know, at the value that asks for what the engine does anyway.
NEUTRAL_UNKNOWN: dict[str, Any] = {"response_format": {"type": "text"}, "tool_choice": "none"}


def check_text(text: str, item: str = "") -> None:
    """Refuse lone surrogates: `"\\ud800"` is valid JSON but not Unicode text, and the
    tokenizer cannot encode it. `item` names the list item that holds it."""
    try:
        text.encode()
    except UnicodeEncodeError as err:
        raise PydanticCustomError(
            "unicode_text",
            "{item}not valid Unicode text: a lone surrogate {char} at character {at}",
            {"item": item, "char": ascii(text[err.start]), "at": err.start},
        ) from None


def check_texts(value: str | list[Any] | None) -> None:
    """check_text on a string, or on each string item of a list."""
    if isinstance(value, str):
        check_text(value)
    for i, item in enumerate(value if isinstance(value, list) else []):
        if isinstance(item, str):
            check_text(item, f"item {i}: ")


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=512)
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = Field(None, max_length=512)
    ignore_eos: bool = False  # an extension (as vLLM has): generate exactly max_tokens

    @field_validator("stop")
    @classmethod
    def _stop_is_text(cls, stop: str | list[str] | None) -> str | list[str] | None:
        check_texts(stop)
        return stop

    def unsupported(self) -> str | None:
        """The first parameter set to a value this engine does not implement."""
        checks = {
            "n": self.n == 1,
            "top_p": self.top_p == 1.0,
            "presence_penalty": self.presence_penalty == 0.0,
            "frequency_penalty": self.frequency_penalty == 0.0,
            "logit_bias": not self.logit_bias,
        }
        for name, value in (self.model_extra or {}).items():
            checks[name] = value in (None, False, [], {}) or NEUTRAL_UNKNOWN.get(name) == value
        return next((name for name, ok in checks.items() if not ok), None)

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]] = Field(
        description="text or token ids, or a list of either: one choice per prompt"
    )
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    best_of: int | None = Field(None, ge=1, le=20)
    suffix: str | None = None

    def unsupported(self) -> str | None:
        checks = {
            "echo": not self.echo,
            "logprobs": self.logprobs is None,
            "best_of": self.best_of in (None, 1),
            "suffix": self.suffix is None,
        }
        return super().unsupported() or next((k for k, ok in checks.items() if not ok), None)

    @field_validator("prompt")
    @classmethod
    def _prompt_is_text(cls, prompt: str | list[Any]) -> str | list[Any]:
        check_texts(prompt)
        return prompt

    def prompts(self) -> list[str | list[int]]:
        """The prompts, one per choice: a text or token ids alone is a list of one (and so is
        [], which the engine refuses as an empty prompt)."""
        prompt = self.prompt
        if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
            return [prompt]
        return list(prompt)


class ContentPart(BaseModel):
    """One part of a message's content, as OpenAI clients send it. Only text parts are
    served; ChatMessage refuses the others by type rather than dropping them silently."""

    type: str = Field(max_length=64, description="only 'text' is supported")
    text: str | None = None


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[ContentPart] = Field(description="text, or a list of text parts")

    @field_validator("content")
    @classmethod
    def _content_is_text(cls, content: str | list[ContentPart]) -> str | list[ContentPart]:
        if isinstance(content, str):
            check_text(content)
            return content
        for i, part in enumerate(content):
            if part.type != "text":
                raise PydanticCustomError(
                    "content_part",
                    "part {i} has type {type}; only text parts are supported",
                    {"i": i, "type": ascii(part.type)},
                )
            if part.text is None:
                raise PydanticCustomError("content_part", "part {i} has no text", {"i": i})
            check_text(part.text, f"part {i}: ")
        return content

    def text(self) -> str:
        """The content as one string: text parts joined by newlines, as vLLM joins them."""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text or "" for part in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=1_000_000)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)

    def unsupported(self) -> str | None:
        if self.logprobs or self.top_logprobs:
            return "logprobs"
        return super().unsupported()


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_choice(index: int, text: str, finish: str | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish}


def _response(
    rid: str, kind: str, model: str, choices: list[dict[str, Any]], use: dict | None
) -> dict[str, Any]:
    """The envelope every answer and chunk shares; `usage` only when given."""
    body: dict[str, Any] = {
        "id": rid,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    }
    if use is not None:
        body["usage"] = use
    return body


def completion_body(
    rid: str, model: str, choices: list[dict[str, Any]], use: dict | None
) -> dict[str, Any]:
    return _response(rid, "text_completion", model, choices, use)


def chat_body(
    rid: str, model: str, text: str, finish: str | None, use: dict | None
) -> dict[str, Any]:
    message = {"role": "assistant", "content": text}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
    return _response(rid, "chat.completion", model, [choice], use)


def chat_chunk(
    rid: str, model: str, delta: dict, finish: str | None, use: dict | None = None
) -> dict[str, Any]:
    choices = (
        []
        if use is not None
        else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    )
    return _response(rid, "chat.completion.chunk", model, choices, use)
