"""What the bench sends: prompts (the text that ships with Python, or a user's JSONL file)
and output lengths drawn from a distribution. Requests ignore EOS, so every request
produces exactly the tokens it asked for and policies are compared on equal work.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal


class BenchError(ValueError):
    """A bench input or target that cannot work; the message is one readable line."""


@dataclass(frozen=True)
class RequestSpec:
    prompt: str
    max_tokens: int
    temperature: float = 0.0  # 0: greedy; sampled text accepts fewer drafted tokens


@dataclass(frozen=True)
class Prompt:
    text: str
    max_tokens: int | None = None  # a JSONL line may fix its own output length


@dataclass(frozen=True)
class OutputLengths:
    """fixed: always `low`; uniform: integers in [low, high]; exp: exponential with mean
    `mean`, rounded up and clipped to [1, high] (a long tail, like chat traffic)."""

    kind: Literal["fixed", "uniform", "exp"]
    low: int
    high: int
    mean: float

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return self.low
        if self.kind == "uniform":
            return rng.randint(self.low, self.high)
        return min(self.high, max(1, round(rng.expovariate(1 / self.mean) + 0.5)))


def parse_lengths(text: str) -> OutputLengths:
    """ "64" | "uniform:32-128" | "exp:64" (the tail is clipped at 4x the mean)."""
    kind, _, arg = text.partition(":") if ":" in text else ("fixed", "", text)
    try:
        if kind == "fixed":
            n = int(arg)
            lengths = OutputLengths("fixed", n, n, n)
        elif kind == "uniform":
            low, high = (int(x) for x in arg.split("-"))
            lengths = OutputLengths("uniform", low, high, (low + high) / 2)
        elif kind == "exp":
            mean = float(arg)
            lengths = OutputLengths("exp", 1, max(1, round(4 * mean)), mean)
        else:
            raise ValueError(kind)
    except ValueError:
        raise BenchError(
            f"output lengths {text!r}: expected N, uniform:LOW-HIGH or exp:MEAN"
        ) from None
    if lengths.low < 1 or lengths.high < lengths.low or lengths.mean < 1:
        raise BenchError(f"output lengths {text!r}: lengths must be at least 1 and low <= high")
    return lengths


def shipped_prompts(count: int, length: int) -> list[Prompt]:
    """`count` prompts of `length` bytes from held-out standard-library source, which the
    built-in models never trained on."""
    from spectune.engine.zoo.training import corpus, held_out_prompts

    _, held_out = corpus(max_bytes=1)
    texts = held_out_prompts(held_out, count, length)
    return [Prompt(bytes(t).decode("utf-8", "replace")) for t in texts]


def load_prompts(path: Path) -> list[Prompt]:
    """JSONL, one object per line: {"prompt": "...", "max_tokens": 64 (optional)}."""
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise BenchError(f"prompt file {path}: {err.strerror or err}") from None
    prompts = [_prompt(path, n, line) for n, line in enumerate(lines, 1) if line.strip()]
    if not prompts:
        raise BenchError(f"prompt file {path} holds no prompts (expected JSONL lines)")
    return prompts


def _prompt(path: Path, number: int, line: str) -> Prompt:
    where = f"prompt file {path}, line {number}"
    try:
        item = json.loads(line)
    except json.JSONDecodeError as err:
        raise BenchError(f"{where}: not JSON ({err.msg})") from None
    if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) or not item["prompt"]:
        raise BenchError(f'{where}: expected an object with a non-empty "prompt" string')
    max_tokens = item.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise BenchError(f'{where}: "max_tokens" must be a positive integer')
    return Prompt(item["prompt"], max_tokens)


def request_stream(
    prompts: list[Prompt], lengths: OutputLengths, rng: random.Random, temperature: float = 0.0
) -> Iterator[RequestSpec]:
    """Endless requests cycling through the prompts, each with its output length."""
    while True:
        for p in prompts:
            yield RequestSpec(p.text, p.max_tokens or lengths.sample(rng), temperature)
