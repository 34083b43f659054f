"""The fixed-shapes gauge, seen from outside: a server whose decode runs fixed shapes (Flex in
place, as on CUDA, where each is a graph the warm-up captures before Ready) reports how many it
has built, so that a rise after Ready shows a request that waited for one. On the CPU they are
eager and built on first use (tests/engine/test_warm_up.py proves the warm-up's coverage), so a
request of a new prefill width raises the gauge here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from openai import OpenAI

from spectune.engine import contract
from tests.support.waiting import wait_until

from .metrics_text import parse, total
from .support import Served, start_server, stop_server


@pytest.fixture(scope="module")
def flex_server(tiny_pair, tmp_path_factory) -> Iterator[Served]:
    config = {
        "model": "tiny-target",
        "draft": "tiny-draft",
        "attention": "flex",
        "max_batch_size": 2,
        "max_model_len": 128,
        "kv_cache_bytes": 4_000_000,  # eager Flex scores every slot of the cache: keep it small
        "speculation": {"k": 2, "threshold": None},
    }
    served = start_server(tmp_path_factory.mktemp("warm"), config)
    yield served
    stop_server(served)


def fixed_shapes(server: Served) -> float:
    return total(parse(server.get("/metrics").text), contract.FIXED_SHAPES)


@pytest.mark.slow  # about 11 s: a server on eager Flex, warmed up
def test_the_gauge_counts_the_fixed_shapes_built(flex_server) -> None:
    built = fixed_shapes(flex_server)
    assert built > 0  # the warm-up's generations ran some
    assert "warmed up in " in flex_server.log.read_text()
    client = OpenAI(base_url=flex_server.url + "/v1", api_key="unused", max_retries=0)
    text = (
        client.completions.create(model="tiny-target", prompt="abc", max_tokens=4, temperature=0)
        .choices[0]
        .text
    )  # a prefill of 3 tokens: no warm-up prompt is that short
    assert text
    assert wait_until("the gauge to rise", lambda: fixed_shapes(flex_server) > built)
