"""Train our own target/draft pairs on the standard library's source, on the CPU.

Byte-level tokenizer (token id = byte value, plus <|endoftext|>), a Llama-architecture
target trained for a fixed number of steps (deterministic for a machine and Python),
and a draft distilled from it (KL to the target's next-byte distribution) so that its
acceptance rate is realistic. Saved in HF format; a build goes to a temporary folder
and is renamed into place, so an interrupted build never leaves a half-written model.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import sysconfig
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from spectune.engine.checkpoint import save_checkpoint
from spectune.engine.model import ModelConfig, Transformer

EOS_ID = 256
VOCAB_SIZE = 257


@dataclass(frozen=True)
class PairSpec:
    target: ModelConfig
    draft: ModelConfig
    target_steps: int
    draft_steps: int
    seq_len: int
    batch: int
    lr: float
    seed: int = 0


def _llama(hidden: int, inter: int, layers: int, heads: int, kv: int, max_len: int) -> ModelConfig:
    return ModelConfig(VOCAB_SIZE, hidden, inter, layers, heads, kv, hidden // heads, max_len)


SPECS = {
    # The draft is distilled to convergence, where its acceptance depends on its size, not
    # on the run: at 150 steps it was still learning fast, and held-out acceptance was 0.43 to
    # 0.76 across seeds and machines; at 400 steps seeds land within 0.02 (docs/PERFORMANCE.md).
    "tiny": PairSpec(
        _llama(256, 688, 4, 8, 4, 1024),
        _llama(48, 128, 1, 4, 2, 1024),
        target_steps=400,
        draft_steps=400,
        seq_len=128,
        batch=16,
        lr=3e-3,
    ),
    "bench": PairSpec(
        _llama(512, 1408, 8, 8, 4, 2048),
        _llama(192, 512, 2, 4, 2, 2048),
        target_steps=600,
        draft_steps=200,
        seq_len=128,
        batch=8,
        lr=2e-3,
    ),
}


def byte_tokenizer() -> Tokenizer:
    """Token id = byte value; GPT-2's printable byte alphabet; 256 is <|endoftext|>."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars = {b: chr(b) for b in printable}
    extra = (b for b in range(256) if b not in chars)
    chars.update({b: chr(256 + i) for i, b in enumerate(extra)})
    vocab = {chars[b]: b for b in range(256)} | {"<|endoftext|>": EOS_ID}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def corpus(max_bytes: int = 8 << 20) -> tuple[torch.Tensor, list[bytes]]:
    """(training bytes, held-out files) from the standard library's .py files; a file is
    held out when the CRC of its relative path is 0 mod 20."""
    root = Path(sysconfig.get_paths()["stdlib"])
    train, held_out, size = [], [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        data = path.read_bytes()
        if zlib.crc32(str(path.relative_to(root)).encode()) % 20 == 0:
            held_out.append(data)
        elif size < max_bytes:
            train.append(data)
            size += len(data)
    joined = b"\n".join(train)[:max_bytes]
    return torch.frombuffer(bytearray(joined), dtype=torch.uint8).long(), held_out


def held_out_prompts(files: list[bytes], count: int, length: int) -> list[list[int]]:
    """`count` prompts of `length` bytes, spread evenly over the held-out text."""
    text = b"\n".join(files)
    step = (len(text) - length) // count
    return [list(text[i * step : i * step + length]) for i in range(count)]


def _init(model: Transformer) -> None:
    for module in model.modules():
        if isinstance(module, torch.nn.Linear | torch.nn.Embedding):
            torch.nn.init.normal_(module.weight, std=0.02)
            if getattr(module, "bias", None) is not None:
                torch.nn.init.zeros_(module.bias)


def _train(
    model: Transformer,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    data: torch.Tensor,
    spec: PairSpec,
    steps: int,
    label: str,
) -> float:
    """AdamW with warmup and cosine decay on random windows; returns the final loss."""
    gen = torch.Generator().manual_seed(spec.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, steps // 20)
    offsets = torch.arange(spec.seq_len + 1)
    loss_value = math.nan
    started = time.monotonic()
    for step in range(steps):
        scale = (
            (step + 1) / warmup
            if step < warmup
            else 0.1 + 0.45 * (1 + math.cos(math.pi * step / steps))
        )
        for group in opt.param_groups:
            group["lr"] = spec.lr * scale
        starts = torch.randint(len(data) - spec.seq_len - 1, (spec.batch, 1), generator=gen)
        window = data[starts + offsets]
        loss = loss_fn(window[:, :-1], window[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_value = loss.item()
        if (step + 1) % max(1, steps // 10) == 0 or step + 1 == steps:
            print(
                f"  {label}: step {step + 1}/{steps}  loss {loss_value:.3f} nats/byte  "
                f"{time.monotonic() - started:.0f}s",
                file=sys.stderr,
                flush=True,
            )
    return loss_value


def _positions(ids: torch.Tensor) -> torch.Tensor:
    return torch.arange(ids.shape[1]).expand_as(ids)


def train_target(spec: PairSpec, data: torch.Tensor, label: str) -> tuple[Transformer, float]:
    torch.manual_seed(spec.seed)
    model = Transformer(spec.target)
    _init(model)

    def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = model(x, _positions(x))
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())

    return model, _train(model, loss_fn, data, spec, spec.target_steps, label)


def distill_draft(
    spec: PairSpec, target: Transformer, data: torch.Tensor, label: str
) -> tuple[Transformer, float]:
    """Fit the draft to the target's next-byte distribution (forward KL), which is what
    speculative acceptance rewards."""
    torch.manual_seed(spec.seed + 1)
    draft = Transformer(spec.draft)
    _init(draft)
    target.eval().requires_grad_(False)

    def loss_fn(x: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            teacher = F.log_softmax(target(x, _positions(x)), dim=-1)
        student = F.log_softmax(draft(x, _positions(x)), dim=-1)
        return F.kl_div(
            student.flatten(0, 1), teacher.flatten(0, 1), log_target=True, reduction="batchmean"
        )

    return draft, _train(draft, loss_fn, data, spec, spec.draft_steps, label)


def measure_acceptance(target: Path, draft: Path, prompts: list[list[int]], k: int = 4) -> float:
    """Greedy draft speculation through the engine itself: accepted / drafted tokens."""
    from spectune.engine.config import EngineConfig
    from spectune.engine.engine import LLMEngine
    from spectune.engine.sequence import SamplingParams

    engine = LLMEngine(
        EngineConfig(model=str(target), draft=str(draft), k=k, device="cpu", min_acceptance=0.0)
    )
    engine.generate(prompts, SamplingParams(max_tokens=64, ignore_eos=True))
    drafted = sum(it.drafted for it in engine.iterations)
    return sum(it.accepted for it in engine.iterations) / max(1, drafted)


def _recipe(spec: PairSpec) -> dict:
    return json.loads(json.dumps(asdict(spec)))


def is_current(path: Path, size: str) -> bool:
    """A built checkpoint of `size`'s current recipe is at `path` (a cache from an older
    recipe is rebuilt, not served with the quality of the old one)."""
    try:
        report = json.loads((path / "build.json").read_text())
    except (OSError, ValueError):
        return False
    return (path / "config.json").is_file() and report.get("spec") == _recipe(SPECS[size])


def held_out_acceptance(target: Path, draft: Path) -> float:
    """Greedy acceptance at k = 4 on 64 held-out prompts: what build.json records and the
    tests measure afresh (16 prompts left a noise of several points)."""
    _, held_out = corpus()
    return measure_acceptance(target, draft, held_out_prompts(held_out, 64, 96))


def build_pair(size: str, root: Path) -> tuple[Path, Path]:
    """Train `size`'s target and draft, save both under root, return their paths."""
    spec = SPECS[size]
    names = (f"{size}-target", f"{size}-draft")
    print(
        f"building {names[0]} and {names[1]} (one-off, cached in {root})",
        file=sys.stderr,
        flush=True,
    )
    started = time.monotonic()
    data, _ = corpus()
    target, target_loss = train_target(spec, data, names[0])
    draft, draft_loss = distill_draft(spec, target, data, names[1])
    tmp = root / f".{size}-building"
    shutil.rmtree(tmp, ignore_errors=True)
    tok = byte_tokenizer()
    for model, name in ((target, names[0]), (draft, names[1])):
        save_checkpoint(model, tok, tmp / name, EOS_ID)
    acceptance = held_out_acceptance(tmp / names[0], tmp / names[1])
    report = {
        "size": size,
        "spec": _recipe(spec),
        "params": {names[0]: _count(target), names[1]: _count(draft)},
        "final_loss_nats_per_byte": {names[0]: target_loss, names[1]: draft_loss},
        "acceptance_rate_k4_held_out": acceptance,
        "build_seconds": round(time.monotonic() - started, 1),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }
    for name in names:
        (tmp / name / "build.json").write_text(json.dumps(report, indent=2))
        shutil.rmtree(root / name, ignore_errors=True)
        (tmp / name).rename(root / name)
    shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"built in {report['build_seconds']}s; draft acceptance at k=4 on held-out text: "
        f"{acceptance:.3f}",
        file=sys.stderr,
        flush=True,
    )
    return root / names[0], root / names[1]


def _count(model: Transformer) -> int:
    return sum(p.numel() for p in model.parameters())
