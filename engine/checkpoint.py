"""Hugging Face checkpoints in and out: config.json, *.safetensors, tokenizer.json.

The model fuses q/k/v and gate/up; HF checkpoints keep them apart. This module is the
only place that knows both spellings.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from spectune.engine.model import ModelConfig, Transformer, rope_inv_freq


class ModelNotFound(FileNotFoundError):
    """No HF-format checkpoint at the given path or name."""


def checkpoint_dir(name: str) -> Path:
    """`name` read as a checkpoint directory (built-in names are the zoo's business)."""
    path = Path(name).expanduser()
    if not path.is_dir():
        raise ModelNotFound(f"model {name!r}: no such directory")
    return path


@dataclass
class Checkpoint:
    model: Transformer
    tokenizer: Tokenizer
    eos_token_ids: frozenset[int]
    name: str
    path: Path
    chat_template: str | None = None  # None: chat uses the documented fallback rendering
    eos_token: str = ""  # the text chat templates get as `eos_token`


def _chat_template(tokenizer_config: dict) -> str | None:
    """tokenizer_config.json's template: a string, or a list of named ones ("default")."""
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _eos_token(tokenizer_config: dict) -> str:
    """tokenizer_config.json's eos_token: a string, or an AddedToken dict ("content")."""
    token = tokenizer_config.get("eos_token")
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else ""


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _eos_ids(path: Path) -> frozenset[int]:
    """EOS ids from generation_config.json, else config.json (an int or a list in both)."""
    for source in ("generation_config.json", "config.json"):
        eos = _read_json(path / source).get("eos_token_id")
        if eos is not None:
            return frozenset(eos if isinstance(eos, list) else [eos])
    return frozenset()


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelNotFound(f"no *.safetensors weights in {path}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(f))
    return tensors


def _from_hf_names(hf: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """HF parameter names → ours (fusing q/k/v and gate/up)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in hf.items():
        name = name.removeprefix("model.")
        if ".self_attn.q_proj." in name or ".mlp.gate_proj." in name:
            continue
        if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name or ".mlp.up_proj." in name:
            continue
        out[name] = t
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}"
        for suffix in ("weight", "bias") if cfg.qkv_bias else ("weight",):
            parts = [hf[f"{p}.self_attn.{x}_proj.{suffix}"] for x in "qkv"]
            out[f"layers.{i}.self_attn.qkv_proj.{suffix}"] = torch.cat(parts)
        gate_up = [hf[f"{p}.mlp.{x}_proj.weight"] for x in ("gate", "up")]
        out[f"layers.{i}.mlp.gate_up_proj.weight"] = torch.cat(gate_up)
    if cfg.tie_word_embeddings:
        out["lm_head.weight"] = out["embed_tokens.weight"]
    return out


def _to_hf_names(model: Transformer) -> dict[str, torch.Tensor]:
    """Our parameter names → HF's (splitting the fused projections)."""
    cfg = model.config
    q_rows, kv_rows = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if cfg.tie_word_embeddings and name == "lm_head.weight":
            continue
        prefix = "" if name == "lm_head.weight" else "model."
        if ".qkv_proj." in name:
            for part, x in zip(t.split([q_rows, kv_rows, kv_rows]), "qkv", strict=True):
                out[prefix + name.replace("qkv_proj", f"{x}_proj")] = part.contiguous()
        elif ".gate_up_proj." in name:
            gate, up = t.chunk(2)
            out[prefix + name.replace("gate_up_proj", "gate_proj")] = gate.contiguous()
            out[prefix + name.replace("gate_up_proj", "up_proj")] = up.contiguous()
        else:
            out[prefix + name] = t.contiguous()
    return out


def load_checkpoint(path: Path, name: str, device: torch.device, dtype: torch.dtype) -> Checkpoint:
    """Load an HF-format Llama/Qwen2 checkpoint directory onto `device` in `dtype`, with the
    chat template and EOS text of its tokenizer_config.json, so that chat requests render
    the way the model was trained to read them (transformers' apply_chat_template)."""
    if not (path / "config.json").is_file():
        raise ModelNotFound(f"model {name!r}: no config.json in {path}")
    if not (path / "tokenizer.json").is_file():
        raise ModelNotFound(f"model {name!r}: no tokenizer.json in {path}")
    cfg = ModelConfig.from_hf(_read_json(path / "config.json"))
    with torch.device("meta"):
        model = Transformer(cfg)
    weights = _from_hf_names(_load_tensors(path), cfg)
    model.load_state_dict(weights, strict=True, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.inv_freq = rope_inv_freq(cfg)  # the buffer was left on the meta device
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    model.inv_freq = rope_inv_freq(cfg).to(device)  # kept in float32 whatever the dtype
    tokenizer_config = _read_json(path / "tokenizer_config.json")
    return Checkpoint(
        model,
        Tokenizer.from_file(str(path / "tokenizer.json")),
        _eos_ids(path),
        name,
        path,
        chat_template=_chat_template(tokenizer_config),
        eos_token=_eos_token(tokenizer_config),
    )


def save_checkpoint(
    model: Transformer, tokenizer: Tokenizer, path: Path, eos_token_id: int
) -> None:
    """Write `model` as an HF Llama checkpoint that transformers can load unchanged."""
    path.mkdir(parents=True, exist_ok=True)
    config = model.config.to_hf() | {"eos_token_id": eos_token_id, "bos_token_id": None}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    gen = {"eos_token_id": eos_token_id, "do_sample": False}
    (path / "generation_config.json").write_text(json.dumps(gen, indent=2))
    weights = path / "model.safetensors"
    save_file(_to_hf_names(model), str(weights), metadata={"format": "pt"})
    # safetensors writes its file owner-only (0600): the umask's mode, as for the other files,
    # so that an engine running as another user (an image's 10001) can read a shared volume.
    weights.chmod(0o666 & ~_umask())
    tokenizer.save(str(path / "tokenizer.json"))


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
