"""Random-weight Llama-architecture models written once as Hugging Face folders, so every
case process of a benchmark loads the very same weights, and the fixed token batch the
benchmarks/ scripts train on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from memfit._utils.atomic import staged_folder


@dataclass(frozen=True)
class LlamaShape:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    kv_heads: int | None = None  # None: as many as heads (no grouped-query attention)
    max_positions: int = 512
    # The embedding's padding row (kept at zero, never trained); None: no padding row.
    pad_token_id: int | None = None


# The model of the memory-techniques issue: untied head, 69.2M parameters.
LLAMA_69M = LlamaShape(hidden=768, layers=8, heads=12, intermediate=2064, vocab=8000)


def llama_config(shape: LlamaShape) -> Any:
    from transformers import LlamaConfig

    extra = {} if shape.pad_token_id is None else {
        "pad_token_id": shape.pad_token_id, "bos_token_id": 1, "eos_token_id": 2}
    return LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden,
                       intermediate_size=shape.intermediate, num_hidden_layers=shape.layers,
                       num_attention_heads=shape.heads,
                       num_key_value_heads=shape.kv_heads or shape.heads,
                       max_position_embeddings=shape.max_positions, tie_word_embeddings=False,
                       **extra)


def save_random_model(folder: Path, model_config: Any, tokenizer: Any = None) -> int:
    """Write a seeded random-weight causal LM of ``model_config`` (a transformers config),
    and ``tokenizer`` when given, as a Hugging Face folder; returns its parameter count."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(model_config)
    with staged_folder(folder) as staging:  # an interrupted write leaves no half folder
        model.save_pretrained(staging, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
    return sum(p.numel() for p in model.parameters())


def token_batch(vocab: int, sequence: int, device: torch.device) -> dict[str, torch.Tensor]:
    """One fixed random sequence (batch 1) used as input and labels."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, vocab, (1, sequence), generator=generator)
    return {"input_ids": input_ids.to(device), "labels": input_ids.to(device),
            "attention_mask": torch.ones_like(input_ids).to(device)}
