"""Our model against Hugging Face transformers, and the paged path against the plain one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from spectune.engine.block_manager import blocks_for
from spectune.engine.checkpoint import load_checkpoint, save_checkpoint
from spectune.engine.model import ModelConfig, Transformer
from spectune.engine.model_runner import Feed, ModelRunner
from spectune.engine.zoo.training import EOS_ID, byte_tokenizer
from tests.support.hf_checkpoints import HF_CONFIGS, hf_checkpoint


@pytest.mark.parametrize("kind", sorted(HF_CONFIGS))
def test_logits_match_transformers(kind: str, tmp_path: Path) -> None:
    hf = hf_checkpoint(kind, tmp_path)
    ours = load_checkpoint(tmp_path, kind, torch.device("cpu"), torch.float32).model
    ids = torch.randint(0, 257, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids).logits
        got = ours(ids, torch.arange(40).expand(2, 40))
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_saved_checkpoint_loads_in_transformers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(257, 64, 96, 2, 4, 2, 16, 128)
    ours = Transformer(cfg).eval()
    save_checkpoint(ours, byte_tokenizer(), tmp_path, EOS_ID)
    # every file readable by others, as the umask allows: an image's user reads a volume
    assert {f.name: f.stat().st_mode & 0o777 for f in tmp_path.iterdir()} == dict.fromkeys(
        ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"), 0o644
    )
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 257, (1, 30))
    with torch.no_grad():
        torch.testing.assert_close(
            ours(ids, torch.arange(30)[None]), hf(ids).logits, atol=1e-4, rtol=1e-4
        )


@pytest.mark.parametrize(
    ("static_shapes", "in_place"), [(False, False), (True, False), (True, True)]
)
def test_paged_decode_matches_full_attention(static_shapes: bool, in_place: bool) -> None:
    """Prefill + token-by-token decode + multi-token verifies through the paged cache give
    the same logits as one causal forward, for sequences of different lengths: gathering
    the cache or reading it in place (FlexAttention), in the graphs' padded shapes or not."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(257, 64, 96, 2, 4, 2, 16, 128)).eval()
    runner = ModelRunner(
        model,
        num_blocks=32,
        block_size=4,
        max_model_len=128,
        cuda_graphs=False,
        static_shapes=static_shapes,
        in_place_attention=in_place,
    )
    seqs = [torch.randint(0, 257, (n,)).tolist() for n in (23, 12, 17)]
    tables = [list(range(1 + 8 * i, 1 + 8 * i + blocks_for(len(s), 4))) for i, s in enumerate(seqs)]
    with torch.no_grad():
        full = [model(torch.tensor([s]), torch.arange(len(s))[None])[0] for s in seqs]
    prefill = 5
    runner.forward(
        [Feed(s[:prefill], 0, t) for s, t in zip(seqs, tables, strict=True)], all_logits=True
    )
    for pos in range(prefill, 8):  # single-token decode steps
        out = runner.forward(
            [Feed([s[pos]], pos, t) for s, t in zip(seqs, tables, strict=True)], False
        )
        for i in range(3):
            torch.testing.assert_close(out[i, 0], full[i][pos], atol=1e-4, rtol=1e-4)
    # ragged multi-position forwards (as verifies are): up to 5 tokens, then the rest
    widths = [5, 3, 4]
    out = runner.forward(
        [Feed(s[8 : 8 + n], 8, t) for s, n, t in zip(seqs, widths, tables, strict=True)],
        all_logits=True,
    )
    for i, n in enumerate(widths):
        torch.testing.assert_close(out[i, :n], full[i][8 : 8 + n], atol=1e-4, rtol=1e-4)
    starts = [8 + n for n in widths]
    out = runner.forward(
        [Feed(s[p:], p, t) for s, p, t in zip(seqs, starts, tables, strict=True)], True
    )
    for i, (s, p) in enumerate(zip(seqs, starts, strict=True)):
        torch.testing.assert_close(out[i, : len(s) - p], full[i][p:], atol=1e-4, rtol=1e-4)
    assert bool(runner.shapes) == static_shapes
