"""Prompts and output lengths: what the bench sends, and readable refusals of bad input."""

from __future__ import annotations

import random
from itertools import islice
from pathlib import Path

import pytest

from spectune.engine.bench.workload import (
    BenchError,
    Prompt,
    load_prompts,
    parse_lengths,
    request_stream,
    shipped_prompts,
)


def test_output_length_distributions() -> None:
    rng = random.Random(1)
    assert parse_lengths("64").sample(rng) == 64
    uniform = parse_lengths("uniform:8-16")
    assert {uniform.sample(rng) for _ in range(500)} == set(range(8, 17))
    exp = parse_lengths("exp:32")
    draws = [exp.sample(rng) for _ in range(4000)]
    assert min(draws) >= 1 and max(draws) <= 128
    assert 28 < sum(draws) / len(draws) < 34  # the clip at 4x trims the tail a little


@pytest.mark.parametrize("text", ["", "x", "uniform:9", "uniform:9-3", "exp:0", "0", "gamma:3"])
def test_bad_output_lengths(text: str) -> None:
    with pytest.raises(BenchError, match="output lengths"):
        parse_lengths(text)


def test_jsonl_prompts(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "def f():"}\n\n{"prompt": "x = ", "max_tokens": 5}\n')
    assert load_prompts(path) == [Prompt("def f():"), Prompt("x = ", 5)]
    specs = list(islice(request_stream(load_prompts(path), parse_lengths("7"), random.Random()), 3))
    assert [(s.prompt, s.max_tokens) for s in specs] == [
        ("def f():", 7),
        ("x = ", 5),
        ("def f():", 7),
    ]


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("", "holds no prompts"),
        ("\n  \n", "holds no prompts"),
        ("not json\n", "line 1: not JSON"),
        (
            '{"prompt": "a"}\n{"text": "b"}\n',
            'line 2: expected an object with a non-empty "prompt"',
        ),
        ('{"prompt": ""}\n', "non-empty"),
        ('{"prompt": "a", "max_tokens": 0}\n', "positive integer"),
    ],
)
def test_bad_prompt_files(tmp_path: Path, content: str, says: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(content)
    with pytest.raises(BenchError, match=says):
        load_prompts(path)


def test_missing_prompt_file(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="No such file"):
        load_prompts(tmp_path / "nope.jsonl")


def test_shipped_prompts_are_held_out_text() -> None:
    prompts = shipped_prompts(8, 48)
    assert len(prompts) == 8 and len({p.text for p in prompts}) == 8
    assert all(40 <= len(p.text) <= 48 for p in prompts)
