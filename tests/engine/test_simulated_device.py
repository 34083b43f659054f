"""A simulated SKU changes the clock and nothing else: the same tokens, each forward charged
exactly what engine/device_time.py says, the wall held to the modelled time, overruns counted."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import pytest

from spectune.engine.config import EngineConfig, InvalidConfig
from spectune.engine.device_time import LLAMA_1B, LLAMA_8B, SKUS, plain_step, sku_named, spec_step
from spectune.engine.engine import LLMEngine
from spectune.engine.gate import GateSettings
from spectune.engine.sequence import SamplingParams
from spectune.engine.simulated_device import SimulatedDevice

from .prompts import PROMPTS

GREEDY = SamplingParams(max_tokens=24, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.8, seed=7)


def engine(tiny_pair, method: str = "draft", **kw: object) -> LLMEngine:
    target, draft = tiny_pair
    extra = {"draft": str(draft)} if method == "draft" else {"method": method}
    return LLMEngine(EngineConfig(model=str(target), max_batch_size=16, **extra, **kw))


@pytest.mark.parametrize("method", ["draft", "ngram"])
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_outputs_are_token_identical_with_and_without_simulation(tiny_pair, method, params):
    real = engine(tiny_pair, method).generate(PROMPTS, params)
    simulated = engine(tiny_pair, method, simulate_device="L4").generate(PROMPTS, params)
    assert [c.token_ids for c in simulated] == [c.token_ids for c in real]


def test_each_iteration_costs_what_the_device_model_says(tiny_pair) -> None:
    scale = 3.0
    eng = engine(tiny_pair, simulate_device="A100", simulate_time_scale=scale)
    eng.simulation.hold = False
    sku = SKUS["A100"]
    seqs = [eng.add_request(p, GREEDY) for p in PROMPTS[:6]]
    eng.step()  # prefill
    eng.gate.settings = GateSettings(threshold=0)  # plain
    contexts = [len(s) - 1 for s in seqs]
    eng.step()
    assert eng.iterations[-1].mode == "plain"
    assert eng.iterations[-1].seconds == pytest.approx(scale * plain_step(sku, LLAMA_8B, contexts))
    eng.gate.settings = GateSettings(threshold=None)  # spec; the first one catches the draft up
    fed = [len(s) - 1 for s in seqs]  # the prompts and the plain iteration's token
    eng.step()
    first = eng.iterations[-1]
    catch_up = LLAMA_1B.forward(sku, sum(fed), 0, sum(n * (n - 1) // 2 for n in fed))
    # Split by tokens: the prompts are the draft's prefill, one token each the plain step's.
    assert first.draft_prefill_seconds == pytest.approx(
        scale * catch_up * (sum(fed) - len(seqs)) / sum(fed)
    )
    assert first.catchup_seconds == pytest.approx(scale * catch_up * len(seqs) / sum(fed))
    contexts = [len(s) - 1 for s in seqs]
    eng.step()
    it = eng.iterations[-1]
    assert it.mode == "spec" and it.catchup_seconds == 0
    expected = spec_step(sku, LLAMA_8B, LLAMA_1B, eng.k, contexts)
    # The draft's first forward also feeds the token it lags by, so reads one cached token
    # less per sequence than the model's k one-token forwards: a few parts in a million.
    assert it.seconds == pytest.approx(scale * expected, rel=1e-4)
    drafting = expected - spec_step(sku, LLAMA_8B, None, eng.k, contexts)
    assert it.draft_seconds == pytest.approx(scale * drafting, rel=1e-4)


def test_the_wall_clock_is_held_to_the_modelled_time(tiny_pair) -> None:
    eng = engine(tiny_pair, "ngram", simulate_device="L4", simulate_time_scale=5.0)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    eng.generate(PROMPTS[:1], params)  # warm-up, as serving does: first forwards run cold
    overruns = eng.simulation.overruns
    eng.add_request(PROMPTS[1], params)
    start_wall, start_modelled = time.perf_counter(), eng.simulation.modelled
    while eng.has_work():
        eng.step()
    modelled = eng.simulation.modelled - start_modelled
    assert modelled > 1.0  # L4 runs an 8B model at ~70 ms a step; x5, over 8 tokens
    assert time.perf_counter() - start_wall >= modelled
    assert eng.simulation.overruns == overruns, [(i.mode, i.seconds) for i in eng.iterations]


def test_an_iteration_slower_than_its_model_is_an_overrun_and_logged(tiny_pair, caplog) -> None:
    eng = engine(tiny_pair, "ngram", simulate_device="H100", simulate_time_scale=1e-6)
    with caplog.at_level(logging.WARNING, "spectune.engine.simulated_device"):
        eng.generate(PROMPTS[:2], SamplingParams(max_tokens=4, ignore_eos=True))
    assert eng.simulation.overruns == len(eng.iterations) >= 2
    assert "raise the time scale" in caplog.text
    assert caplog.text.count("raise the time scale") == 1  # rate-limited, not one per step


def test_a_context_scale_charges_each_cached_token_that_many_times(tiny_pair) -> None:
    """Longer prompts weigh as long contexts would: a plain step reads 8x the real cache."""
    eng = engine(tiny_pair, "ngram", simulate_device="A100", simulate_context_scale=8)
    eng.simulation.hold = False
    seqs = [eng.add_request(p, GREEDY) for p in PROMPTS[:6]]
    eng.step()  # prefill
    eng.gate.settings = GateSettings(threshold=0)  # plain
    contexts = [8 * (len(s) - 1) for s in seqs]
    eng.step()
    assert eng.iterations[-1].mode == "plain"
    assert eng.iterations[-1].seconds == pytest.approx(
        plain_step(SKUS["A100"], LLAMA_8B, contexts), rel=1e-9
    )


def test_the_device_label_names_the_sku(tiny_pair) -> None:
    assert engine(tiny_pair, "ngram", device="cpu").device_label == "cpu"
    label = engine(tiny_pair, "ngram", simulate_device="nvidia-a100-sxm4-40gb").device_label
    assert label == "NVIDIA-A100-SXM4-40GB"


def test_unknown_skus_and_bad_scales_are_refused() -> None:
    assert sku_named("h100") is SKUS["H100"]
    with pytest.raises(ValueError, match=r"unknown GPU SKU 'B200'.*H100.*L4"):
        sku_named("B200")
    with pytest.raises(InvalidConfig, match="simulate_time_scale must be > 0"):
        EngineConfig(model="m", simulate_time_scale=0)
    with pytest.raises(InvalidConfig, match="simulate_context_scale must be > 0"):
        EngineConfig(model="m", simulate_context_scale=0)


@pytest.mark.parametrize(("scale", "extra"), [(1.0, 0), (8.0, 0), (2.5, 300)])
def test_one_token_each_costs_what_one_feed_each_costs(scale: float, extra: int) -> None:
    """The fleet simulator's shortcut for plain and proposal steps charges exactly what a feed
    per sequence charges, under a context scale and an extra context too."""
    starts = [0, 1, 17, 333, 4096]

    @dataclass
    class Feed:
        tokens: list[int]
        start: int

    by_feed, by_start = (
        SimulatedDevice(SKUS["L4"], hold=False, extra_context=extra, context_scale=scale)
        for _ in range(2)
    )
    for model in (LLAMA_8B, LLAMA_1B):
        by_feed.charge(model, [Feed([0], s) for s in starts])
        by_start.charge_one_each(model, starts)
        assert by_start.modelled == by_feed.modelled > 0
