"""Engine benchmarks behind docs/PERFORMANCE.md, measured in one run on one machine.

1. plain decode vs transformers `generate`, batch 1 and 16
2. draft speculation at batch 1 vs our plain decode and vs transformers' assisted generation
3. gate-off cost: a draft engine gated off vs an engine without speculation (median TPOT)
4. Python overhead per decode iteration at batch 1 on the tiny pair

Every comparison runs its two sides alternately (A B A B ...), so that other work on a
shared machine falls on both alike; it reports each side's median and the median of the
per-round ratios. Models are loaded and warmed before timing; only generation is timed.

Usage: .venv/bin/python benchmarks/engine_bench.py [--size bench|tiny] [--repeats 5]
       [--tokens 128] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from spectune.engine.config import EngineConfig
from spectune.engine.engine import LLMEngine
from spectune.engine.gate import GateSettings
from spectune.engine.model_runner import Feed
from spectune.engine.sequence import SamplingParams
from spectune.engine.zoo.registry import SIZES, resolve_model
from spectune.engine.zoo.training import corpus, held_out_prompts

# Several engines live in this one process; on CUDA each would otherwise take 85% of the
# memory still free, and the last one OOMs (seen on an H200). 512 MiB holds every batch here.
KV = 512 << 20


@dataclass(frozen=True)
class Pair:
    a: float  # median of side A (tokens/s, or seconds for TPOT)
    b: float
    ratio: float  # median of the per-round A/B ratios


def seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def paired(a: Callable[[], float], b: Callable[[], float], repeats: int) -> Pair:
    """Alternate two measurements (each returns a number), after one warm-up of each."""
    a(), b()
    xs, ys = [], []
    for _ in range(repeats):
        xs.append(a())
        ys.append(b())
    ratios = [x / y for x, y in zip(xs, ys, strict=True)]
    return Pair(statistics.median(xs), statistics.median(ys), statistics.median(ratios))


class Ours:
    def __init__(self, target: str, device: str, **kw: object) -> None:
        self.engine = LLMEngine(
            EngineConfig(model=target, device=device, dtype="float32", kv_cache_bytes=KV, **kw),
            resolve_model=resolve_model,
        )

    def tokens_per_second(self, prompts: list[list[int]], tokens: int) -> float:
        self.engine.iterations.clear()
        params = SamplingParams(max_tokens=tokens, ignore_eos=True)
        return len(prompts) * tokens / seconds(lambda: self.engine.generate(prompts, params))

    def median_tpot(self, prompts: list[list[int]], tokens: int) -> float:
        """Median decode iteration time: one token per sequence per plain iteration."""
        self.tokens_per_second(prompts, tokens)
        return statistics.median(it.seconds for it in self.engine.iterations if it.mode == "plain")

    def acceptance(self) -> float:
        spec = [it for it in self.engine.iterations if it.mode == "spec"]
        return sum(it.accepted for it in spec) / max(1, sum(it.drafted for it in spec))


class Transformers:
    def __init__(self, target: str, device: str, assistant: str | None = None) -> None:
        import transformers

        load = transformers.AutoModelForCausalLM.from_pretrained
        self.device = device
        self.model = load(target).eval().to(device)
        self.kwargs: dict = {"do_sample": False, "pad_token_id": 256}
        if assistant:
            self.kwargs["assistant_model"] = load(assistant).eval().to(device)

    def tokens_per_second(self, prompts: list[list[int]], tokens: int) -> float:
        ids = torch.tensor(prompts, device=self.device)

        def run() -> None:
            with torch.inference_mode():
                out = self.model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=tokens,
                    min_new_tokens=tokens,
                    **self.kwargs,
                )
            assert out.shape[1] == ids.shape[1] + tokens  # .shape waits for the device too

        return len(prompts) * tokens / seconds(run)


def decode_overhead(device: str, repeats: int) -> dict[str, float]:
    """Batch-1 plain decode on the tiny target: engine step vs runner forward vs the bare model."""
    engine = LLMEngine(
        EngineConfig(model="tiny-target", device=device, dtype="float32", kv_cache_bytes=KV),
        resolve_model=resolve_model,
    )
    seq = engine.add_request([65] * 32, SamplingParams(max_tokens=4000, ignore_eos=True))
    for _ in range(20):
        engine.step()

    def median_ms(fn: Callable[[], object]) -> float:
        return statistics.median(seconds(fn) for _ in range(repeats * 100)) * 1e3

    step = median_ms(engine.step)
    feed = [Feed([seq.token_ids[-1]], len(seq) - 1, seq.block_table)]
    forward = median_ms(lambda: engine.runner.forward(feed, all_logits=False))
    ids, pos, slots, tables, _ = engine.runner._prepare(feed, 1)

    def bare() -> None:
        with torch.inference_mode():
            engine.runner._run(ids, pos, slots, tables, None)

    return {
        "engine step": step,
        "runner forward (tensor prep + model)": forward,
        "model only": median_ms(bare),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=tuple(SIZES), default="bench")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    target, draft = (str(resolve_model(n)) for n in SIZES[args.size])
    prompts = held_out_prompts(corpus()[1], 16, 64)
    n, r, dev = args.tokens, args.repeats, args.device

    plain, spec = Ours(target, dev), Ours(target, dev, draft=draft, k=4)
    hf, assisted = Transformers(target, dev), Transformers(target, dev, assistant=draft)
    rows = []
    for batch in (1, 16):
        ps = prompts[:batch]
        p = paired(
            lambda ps=ps: plain.tokens_per_second(ps, n),
            lambda ps=ps: hf.tokens_per_second(ps, n),
            r,
        )
        rows.append((f"plain decode, batch {batch}: ours / transformers generate", p))
    one = prompts[:1]
    p = paired(lambda: spec.tokens_per_second(one, n), lambda: plain.tokens_per_second(one, n), r)
    rows.append(
        (
            f"draft speculation k=4, batch 1 (acceptance {spec.acceptance():.2f}): "
            "ours / our plain",
            p,
        )
    )
    p = paired(
        lambda: spec.tokens_per_second(one, n), lambda: assisted.tokens_per_second(one, n), r
    )
    rows.append(("draft speculation k=4, batch 1: ours / transformers assisted generation", p))

    gated_off = Ours(target, dev, draft=draft, k=4, gate=GateSettings(threshold=0))
    eight = prompts[:8]
    tpot = paired(lambda: gated_off.median_tpot(eight, n), lambda: plain.median_tpot(eight, n), r)
    overhead = decode_overhead(dev, r)

    print(
        f"machine: {platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, device {dev}; "
        f"models: {args.size}-target / {args.size}-draft (fp32); {n} new tokens; "
        f"{r} alternating rounds, medians"
    )
    print(
        "\n| comparison (A / B) | A tokens/s | B tokens/s | median ratio A/B |\n|---|---|---|---|"
    )
    for name, p in rows:
        print(f"| {name} | {p.a:.1f} | {p.b:.1f} | {p.ratio:.2f} |")
    print("\n| gate-off cost, batch 8 | median TPOT ms |\n|---|---|")
    print(f"| draft configured, gated off (threshold 0) | {tpot.a * 1e3:.2f} |")
    print(f"| no speculation | {tpot.b * 1e3:.2f} |")
    print(f"| median ratio gated-off / none | {tpot.ratio:.3f} |")
    print("\n| batch-1 plain decode iteration, tiny-target | median ms |\n|---|---|")
    for label, value in overhead.items():
        print(f"| {label} | {value:.3f} |")
    outside = overhead["engine step"] - overhead["runner forward (tensor prep + model)"]
    print(f"| engine overhead outside the runner (scheduling, sampling) | {outside:.3f} |")


if __name__ == "__main__":
    main()
