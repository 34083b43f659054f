"""The device-time model and its analytic crossover move the way the roofline says: a lower
FLOP/s-to-bandwidth ratio crosses earlier, longer contexts later, lower acceptance earlier."""

from __future__ import annotations

import dataclasses
import math

import pytest

from spectune.engine.device_time import (
    LLAMA_1B,
    LLAMA_8B,
    SKUS,
    Setting,
    analytic_crossover,
    expected_tokens,
    plain_step,
    spec_step,
)

H100 = SKUS["H100"]
METHODS = [(LLAMA_1B, 0.7), (None, 0.5)]  # a draft model; n-gram lookup accepts less


def setting(sku: str = "H100", draft=LLAMA_1B, acceptance=0.7, context=256, **kw) -> Setting:
    return Setting(SKUS[sku], LLAMA_8B, draft, kw.pop("k", 4), acceptance, context, **kw)


def test_a_forward_is_flat_while_memory_bound_then_grows_with_positions() -> None:
    one = LLAMA_8B.forward(H100, 1, 0, 0)
    weights = LLAMA_8B.params * 2 / (H100.bandwidth * H100.bandwidth_share)
    assert one == pytest.approx(weights + H100.forward_overhead)
    assert LLAMA_8B.forward(H100, 64, 0, 0) == one  # 64 positions: still memory-bound
    big = LLAMA_8B.forward(H100, 4096, 0, 0)
    assert big > 10 * one
    assert LLAMA_8B.forward(H100, 8192, 0, 0) - H100.forward_overhead == pytest.approx(
        2 * (big - H100.forward_overhead)
    )


def test_kv_reads_and_tensor_parallel_gpus() -> None:
    assert plain_step(H100, LLAMA_8B, [4096] * 8) > plain_step(H100, LLAMA_8B, [16] * 8)
    tp = plain_step(H100, LLAMA_8B, [256] * 8, gpus=2) - H100.forward_overhead
    assert tp == pytest.approx((plain_step(H100, LLAMA_8B, [256] * 8) - H100.forward_overhead) / 2)


def test_a_spec_step_is_k_draft_forwards_and_one_verify() -> None:
    contexts = [100, 200]
    ngram = spec_step(H100, LLAMA_8B, None, 4, contexts)
    assert ngram == LLAMA_8B.forward(H100, 10, 300, 5 * 300 + 2 * 10)
    drafted = spec_step(H100, LLAMA_8B, LLAMA_1B, 4, contexts)
    assert drafted - ngram == pytest.approx(
        sum(LLAMA_1B.forward(H100, 2, 300 + 2 * i, 300 + 2 * i) for i in range(4))
    )


def test_expected_tokens() -> None:
    assert expected_tokens(0.0, 4) == 1.0 and expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    with pytest.raises(ValueError):
        expected_tokens(1.5, 4)


@pytest.mark.parametrize(("draft", "acceptance"), METHODS)
def test_the_crossover_is_where_the_speedup_falls_through_one(draft, acceptance) -> None:
    s = setting(draft=draft, acceptance=acceptance)
    crossover = analytic_crossover(s)
    assert crossover is not None and s.speedup(1) > 1
    assert s.speedup(math.floor(crossover)) >= 1 > s.speedup(math.ceil(crossover))


@pytest.mark.parametrize(("draft", "acceptance"), METHODS)
def test_a_lower_flops_to_bandwidth_ratio_crosses_earlier(draft, acceptance) -> None:
    order = sorted(SKUS, key=lambda name: SKUS[name].ridge)
    assert order[0] == "A100" and order[-1] == "L4"
    crossovers = [analytic_crossover(setting(n, draft, acceptance)) for n in order]
    assert crossovers == sorted(crossovers) and crossovers[0] < crossovers[-1] / 2


@pytest.mark.parametrize(("draft", "acceptance"), METHODS)
def test_longer_contexts_raise_and_lower_acceptance_lowers_the_crossover(draft, acceptance) -> None:
    base = analytic_crossover(setting("A100", draft, acceptance, context=256))
    longer = analytic_crossover(setting("A100", draft, acceptance, context=1024))
    worse = analytic_crossover(setting("A100", draft, acceptance - 0.2, context=256))
    assert worse < base < longer


def test_never_paying_and_always_paying_are_said_apart() -> None:
    hopeless = setting(acceptance=0.0)
    assert hopeless.speedup(1) < 1 and analytic_crossover(hopeless) == 1.0
    assert analytic_crossover(setting(context=2048), max_batch=256) is None


def test_the_drafts_prefill_spread_over_a_request_lowers_the_speedup() -> None:
    """Each request's prompt is read by the draft once; spread over its output it costs a
    share of every spec step, more for longer prompts and shorter outputs."""
    plain = Setting(SKUS["A100"], LLAMA_8B, LLAMA_1B, 4, 0.7, 320)
    short, long_ = (dataclasses.replace(plain, requests=(256, n)) for n in (32, 512))
    assert short.speedup(32) < long_.speedup(32) < plain.speedup(32)
    ngram = dataclasses.replace(plain, draft=None)
    assert dataclasses.replace(ngram, requests=(256, 32)).speedup(32) == ngram.speedup(32)
