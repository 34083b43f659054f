"""Checkpoints written by Hugging Face transformers: small random Llama and Qwen2 models (with
the features our loader must get right: llama3 rope scaling, q/k/v biases, tied embeddings)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from spectune.engine.zoo.training import byte_tokenizer

COMMON = {
    "vocab_size": 257,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
}
HF_CONFIGS = {
    "llama": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        {
            "rope_theta": 50000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "qwen2": (
        transformers.Qwen2Config,
        transformers.Qwen2ForCausalLM,
        {"tie_word_embeddings": True, "rope_theta": 1e6},
    ),
}


def hf_checkpoint(kind: str, path: Path) -> torch.nn.Module:
    """A small random `kind` model saved by transformers' save_pretrained, with the byte
    tokenizer; the model itself, to compare with."""
    config_cls, model_cls, extra = HF_CONFIGS[kind]
    torch.manual_seed(0)
    model = model_cls(config_cls(**COMMON, **extra)).eval()
    for p in model.parameters():  # random biases too, so q/k/v bias loading is checked
        torch.nn.init.normal_(p, std=0.1)
    model.save_pretrained(path)
    byte_tokenizer().save(str(path / "tokenizer.json"))
    return model
