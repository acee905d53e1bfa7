"""Random-weight Llama folders: the same seeded weights every time, the shape as asked."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from memfit.bench.random_llama import LlamaShape, llama_config, save_random_model, token_batch

SHAPE = LlamaShape(hidden=32, layers=2, heads=4, intermediate=64, vocab=100)


def test_two_writes_hold_the_same_weights_of_the_shape(tmp_path: Path):
    count = save_random_model(tmp_path / "a", llama_config(SHAPE))
    save_random_model(tmp_path / "b", llama_config(SHAPE))
    first, second = (load_file(tmp_path / name / "model.safetensors") for name in "ab")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[key], second[key]) for key in first)
    assert count == sum(tensor.numel() for tensor in first.values())  # untied head saved
    assert first["model.embed_tokens.weight"].shape == (100, 32)
    assert first["model.layers.0.self_attn.k_proj.weight"].shape == (32, 32)  # kv = heads
    assert not list(tmp_path.glob(".*"))  # written through a staging folder


def test_grouped_query_shape_and_padding_row():
    config = llama_config(LlamaShape(hidden=32, layers=1, heads=4, intermediate=64, vocab=100,
                                     kv_heads=2, max_positions=64, pad_token_id=0))
    assert (config.num_key_value_heads, config.max_position_embeddings) == (2, 64)
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == (0, 1, 2)
    assert llama_config(SHAPE).pad_token_id is None


def test_token_batch_is_fixed_and_its_own_labels():
    first = token_batch(100, 16, torch.device("cpu"))
    second = token_batch(100, 16, torch.device("cpu"))
    assert first["input_ids"].shape == (1, 16)
    assert torch.equal(first["input_ids"], second["input_ids"])
    assert torch.equal(first["labels"], first["input_ids"])
    assert bool(first["attention_mask"].all())
