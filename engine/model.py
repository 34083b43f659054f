"""Llama-architecture decoder (Llama and Qwen2 families) over a paged KV cache.

One file you can read in one sitting: RMSNorm, rotary embeddings, grouped-query
attention and a SwiGLU MLP. q/k/v and gate/up are fused into one matmul each (fewer,
larger kernels); the checkpoint module splits and joins them at the HF boundary.

Attention has two paths: `cache=None` is plain causal attention over the given tokens
(training, reference); otherwise new K/V are written into a paged cache at absolute
slots and every query attends to its sequence's slots, so a rejected draft needs no
rollback: the next write to that position overwrites it. Those slots are read either
gathered into a new tensor (SDPA) or in place (FlexAttention): see PagedBatch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask


class UnsupportedArchitecture(ValueError):
    """The checkpoint is not a Llama/Qwen2-style decoder this engine can run."""


SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, float], ...] | None = None
    qkv_bias: bool = False
    o_bias: bool = False
    tie_word_embeddings: bool = False

    @classmethod
    def from_hf(cls, hf: dict) -> ModelConfig:
        """Read an HF config.json dict; reject what the model below does not implement."""
        arch = (hf.get("architectures") or ["?"])[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedArchitecture(
                f"architecture {arch!r} is not supported (supported: "
                f"{', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        if hf.get("use_sliding_window") or hf.get("mlp_bias"):
            raise UnsupportedArchitecture(
                "sliding-window attention and MLP biases are not supported"
            )
        # transformers >= 5 writes rope_parameters (theta inside); older checkpoints
        # have rope_theta and rope_scaling at the top level.
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "llama3"):
            raise UnsupportedArchitecture(f"rope type {rope_type!r} is not supported")
        scaling = rope if rope_type == "llama3" else None
        heads = hf["num_attention_heads"]
        is_qwen2 = arch == "Qwen2ForCausalLM"
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", hf.get("rope_theta", 10000.0)),
            rope_scaling=tuple(sorted((k, v) for k, v in scaling.items() if k in _LLAMA3_KEYS))
            if scaling
            else None,
            qkv_bias=is_qwen2 or bool(hf.get("attention_bias")),
            o_bias=not is_qwen2 and bool(hf.get("attention_bias")),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        )

    def to_hf(self) -> dict:
        """The config.json of a Llama checkpoint that transformers loads unchanged."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "attention_bias": self.qkv_bias,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "torch_dtype": "float32",
        }

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token across all layers, in elements (multiply by dtype size)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim


_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def rope_inv_freq(cfg: ModelConfig) -> Tensor:
    """Rotary frequencies, with Llama 3's long-context rescaling when configured."""
    inv = 1.0 / cfg.rope_theta ** (
        torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim
    )
    if cfg.rope_scaling is None:
        return inv.float()
    s = dict(cfg.rope_scaling)
    old_len, factor = s["original_max_position_embeddings"], s["factor"]
    low_wavelen = old_len / s["low_freq_factor"]
    high_wavelen = old_len / s["high_freq_factor"]
    wavelen = 2 * math.pi / inv
    smooth = (old_len / wavelen - s["low_freq_factor"]) / (
        s["high_freq_factor"] - s["low_freq_factor"]
    )
    blended = (1 - smooth) * inv / factor + smooth * inv
    out = torch.where(wavelen > low_wavelen, inv / factor, inv)
    out = torch.where((wavelen <= low_wavelen) & (wavelen >= high_wavelen), blended, out)
    return out.float()


def apply_rope(x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    """HF's rotate-half RoPE in three ops: rolling by d/2 swaps the halves, and the sign of
    the first half's sine is folded into `sin_signed` (see Transformer.forward)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin_signed


def rotary_split(
    qkv: Tensor, cos: Tensor, sin: Tensor, h: int, kv: int
) -> tuple[Tensor, Tensor, Tensor]:
    """[B, L, h + 2 kv, d] -> q, k (both rotated, in one go) and v."""
    qk = apply_rope(qkv[:, :, : h + kv], cos, sin)
    return qk[:, :, :h], qk[:, :, h:], qkv[:, :, h + kv :]


def swiglu(gate_up: Tensor) -> Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


@dataclass
class PagedBatch:
    """Device tensors describing where a padded batch of queries reads and writes KV.

    slot_mapping: [B, L] cache slot each new token's K/V goes to (pads go to slot 0,
    a scratch slot no sequence owns). block_tables: [B, W] each sequence's blocks in
    position order. Attention reads them one of two ways (model_runner builds either):
    mask [B, 1, L, S]: gather each sequence's blocks (S = W * block_size keys) into a new
    tensor and run SDPA under this causal and length mask; block_mask: FlexAttention reads
    the cache in place, each row visiting only its own blocks.
    """

    slot_mapping: Tensor
    block_tables: Tensor
    block_size: int
    mask: Tensor | None = None
    block_mask: BlockMask | None = None

    def gather(self, cache: Tensor) -> Tensor:
        """[B, S, kv, d] keys or values of each sequence. Whole blocks through index_select:
        1.7x faster on the CPU than indexing slot by slot (benchmarks/layout_bench.py)."""
        blocks = cache.view(-1, self.block_size, *cache.shape[1:])
        picked = blocks.index_select(0, self.block_tables.flatten())
        return picked.view(self.block_tables.shape[0], -1, *cache.shape[1:])

    def attend(self, q: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        """q [B, h, L, d] over the cache [slots, kv, d] -> [B, h, L, d]."""
        if self.block_mask is None:
            keys = self.gather(k_cache).transpose(1, 2)  # [B, kv, S, d]
            values = self.gather(v_cache).transpose(1, 2)
            return F.scaled_dot_product_attention(
                q, keys, values, attn_mask=self.mask, enable_gqa=True
            )
        from torch.nn.attention.flex_attention import flex_attention  # 0.5 s: only if used

        # The whole cache as one sequence, [1, kv, slots, d] (a view), broadcast over rows.
        keys, values = (c.unsqueeze(0).transpose(1, 2) for c in (k_cache, v_cache))
        flex = _compiled_flex() if q.is_cuda else flex_attention  # eager: the CPU reference
        return flex(q, keys, values, block_mask=self.block_mask, enable_gqa=True)


@cache
def _compiled_flex() -> Callable[..., Tensor]:
    """One compile per shape: the runner sends only the fixed shapes its graphs capture
    (batch buckets x widths x two models: more than dynamo's default limit of 8)."""
    from torch.nn.attention.flex_attention import flex_attention

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
    return torch.compile(flex_attention, dynamic=False)


KVCache = tuple[Tensor, Tensor]  # each [num_slots, num_kv_heads, head_dim]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.h, self.kv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv_proj = nn.Linear(
            cfg.hidden_size, (self.h + 2 * self.kv) * self.d, bias=cfg.qkv_bias
        )
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=cfg.o_bias)
        self.rotary = rotary_split  # model_runner may swap in a compiled twin

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache | None, paged: PagedBatch | None
    ) -> Tensor:
        b, n, _ = x.shape
        qkv = self.qkv_proj(x).view(b, n, self.h + 2 * self.kv, self.d)
        q, k, v = self.rotary(qkv, cos, sin, self.h, self.kv)
        if cache is None or paged is None:
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v.transpose(1, 2),
                is_causal=True,
                enable_gqa=True,
            )
        else:
            k_cache, v_cache = cache
            slots = paged.slot_mapping.reshape(-1)
            k_cache.index_copy_(0, slots, k.reshape(-1, self.kv, self.d))
            v_cache.index_copy_(0, slots, v.reshape(-1, self.kv, self.d))
            out = paged.attend(q.transpose(1, 2), k_cache, v_cache)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, self.h * self.d))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.activation = swiglu  # model_runner may swap in a compiled twin

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.activation(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache | None, paged: PagedBatch | None
    ) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, paged)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        caches: list[KVCache] | None = None,
        paged: PagedBatch | None = None,
        logits_index: Tensor | None = None,
    ) -> Tensor:
        """input_ids, positions: [B, L]. logits_index: [B, M] positions to score (default all).

        Returns logits [B, M, vocab] in float32.
        """
        x = self.embed_tokens(input_ids)
        freqs = positions.unsqueeze(-1).float() * self.inv_freq  # [B, L, d/2]
        cos = freqs.cos().repeat(1, 1, 2).unsqueeze(2).to(x.dtype)  # [B, L, 1, d]
        sin = freqs.sin()
        sin = torch.cat((-sin, sin), dim=-1).unsqueeze(2).to(x.dtype)  # signed for apply_rope
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, caches[i] if caches is not None else None, paged)
        if logits_index is not None:
            x = x.gather(1, logits_index.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        return self.lm_head(self.norm(x)).float()
