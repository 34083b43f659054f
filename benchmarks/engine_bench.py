"""Engine benchmarks behind docs/PERFORMANCE.md, measured in one run on one machine.

1. plain decode vs transformers `generate`, batch 1 and 16
2. draft speculation at batch 1 vs our plain decode and vs transformers' assisted generation
3. gate-off cost: a draft engine gated off vs an engine without speculation (median TPOT)
4. Python overhead per decode iteration at batch 1 on the tiny pair

Usage: .venv/bin/python benchmarks/engine_bench.py [--size bench|tiny] [--repeats 3] [--tokens 128]
       [--device cpu|cuda]
Prints a markdown report; every number is a median over repeats.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import torch

from spectune.engine.config import EngineConfig
from spectune.engine.engine import LLMEngine
from spectune.engine.gate import GateSettings
from spectune.engine.model_runner import Feed
from spectune.engine.sequence import SamplingParams
from spectune.engine.training import corpus, held_out_prompts
from spectune.engine.zoo import SIZES, resolve_model


def median_time(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


DEVICE = "cpu"


def ours(target: str, prompts: list[list[int]], tokens: int, **kw: object) -> LLMEngine:
    engine = LLMEngine(
        EngineConfig(model=target, device=DEVICE, dtype="float32", max_batch_size=64, **kw)
    )
    engine.generate(prompts, SamplingParams(max_tokens=tokens, ignore_eos=True))
    return engine


def hf_generate(
    target: str, prompts: list[list[int]], tokens: int, assistant: str | None
) -> Callable[[], object]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(target).eval().to(DEVICE)
    kwargs: dict = {
        "max_new_tokens": tokens,
        "min_new_tokens": tokens,
        "do_sample": False,
        "pad_token_id": 256,
    }
    if assistant:
        kwargs["assistant_model"] = transformers.AutoModelForCausalLM.from_pretrained(
            assistant
        ).eval()
    ids = torch.tensor(prompts)

    def run() -> object:
        with torch.inference_mode():
            return model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)

    return run


def tokens_per_second(fn: Callable[[], object], n_tokens: int, repeats: int) -> float:
    return n_tokens / median_time(fn, repeats)


def decode_overhead(repeats: int) -> dict[str, float]:
    """Batch-1 plain decode on the tiny target: engine step vs runner forward vs the bare model."""
    engine = LLMEngine(EngineConfig(model="tiny-target", device=DEVICE, dtype="float32"))
    seq = engine.add_request([65] * 32, SamplingParams(max_tokens=1000, ignore_eos=True))
    for _ in range(20):
        engine.step()
    step = median_time(engine.step, repeats * 50)
    feed = [Feed([seq.token_ids[-1]], len(seq) - 1, seq.block_table)]
    forward = median_time(lambda: engine.runner.forward(feed, all_logits=False), repeats * 50)
    ids, pos, slots, tables = engine.runner._prepare(feed, 1)

    def bare() -> None:
        with torch.inference_mode():
            engine.runner._run(ids, pos, slots, tables, None)

    return {
        "step_ms": step * 1e3,
        "runner_forward_ms": forward * 1e3,
        "model_ms": median_time(bare, repeats * 50) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=tuple(SIZES), default="bench")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    global DEVICE  # one setting for the whole run
    DEVICE = args.device
    target, draft = (str(resolve_model(n)) for n in SIZES[args.size])
    _, held_out = corpus()
    prompts = held_out_prompts(held_out, 16, 64)
    n, r = args.tokens, args.repeats
    rows: list[tuple[str, float, str]] = []

    for batch in (1, 16):
        ps = prompts[:batch]
        mine = tokens_per_second(lambda ps=ps: ours(target, ps, n), n * batch, r)
        hf = tokens_per_second(hf_generate(target, ps, n, None), n * batch, r)
        rows.append(
            (f"plain decode, batch {batch}: ours", mine, f"{mine / hf:.2f}x transformers generate")
        )
        rows.append((f"plain decode, batch {batch}: transformers generate", hf, "baseline"))

    plain1 = next(v for name, v, _ in rows if name.startswith("plain decode, batch 1: ours"))
    acceptance: list[float] = []

    def spec_run() -> None:
        engine = ours(target, prompts[:1], n, draft=draft, k=4)
        spec = [it for it in engine.iterations if it.mode == "spec"]
        acceptance.append(sum(it.accepted for it in spec) / sum(it.drafted for it in spec))

    spec1 = tokens_per_second(spec_run, n, r)
    assisted = tokens_per_second(hf_generate(target, prompts[:1], n, draft), n, r)
    rows.append(
        (
            "draft speculation k=4, batch 1: ours",
            spec1,
            f"{spec1 / plain1:.2f}x our plain, {spec1 / assisted:.2f}x transformers assisted, "
            f"acceptance {statistics.median(acceptance):.2f}",
        )
    )
    rows.append(("assisted generation, batch 1: transformers", assisted, "baseline"))

    tpot: dict[str, float] = {}
    for label, kw in (
        ("no speculation", {}),
        ("draft, gated off", {"draft": draft, "gate": GateSettings(threshold=0)}),
    ):
        runs = [ours(target, prompts[:8], n, **kw) for _ in range(r)]
        tpot[label] = statistics.median(
            it.seconds for e in runs for it in e.iterations if it.mode == "plain"
        )
    overhead = decode_overhead(r)

    print(
        f"machine: {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}; "
        f"models: {args.size}-target / {args.size}-draft; {n} new tokens; median of {r}"
    )
    print("\n| measurement | tokens/s | ratio |\n|---|---|---|")
    for name, value, ratio in rows:
        print(f"| {name} | {value:.1f} | {ratio} |")
    ratio = tpot["draft, gated off"] / tpot["no speculation"]
    print("\n| gate-off cost, batch 8 | median TPOT ms |\n|---|---|")
    for label, value in tpot.items():
        print(f"| {label} | {value * 1e3:.2f} |")
    print(f"| ratio gated-off / none | {ratio:.3f} |")
    print("\n| batch-1 decode iteration, tiny-target | ms |\n|---|---|")
    for label, value in overhead.items():
        print(f"| {label} | {value:.3f} |")
    outside = overhead["step_ms"] - overhead["runner_forward_ms"]
    print(f"| engine overhead outside the runner | {outside:.3f} |")


if __name__ == "__main__":
    main()
