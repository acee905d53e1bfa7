"""The adapter map: groups by pattern with their counts, parameters trained in full, the
frozen count (of the original weights under a 4-bit base), and the fused-qkv warning."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from technique_models import Autoencoder
from torch import nn
from transformers import AutoModelForCausalLM

from memfit.config.schema import AdapterConfig, Precision
from memfit.models.presets import tiny_llama
from memfit.techniques import lora, quantize
from memfit.techniques.adapter_map import AdaptedGroup, TrainedGroup, adapter_map


def llama():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_llama())


def trainable_numel(model, fragment: str) -> int:
    return sum(p.numel() for name, p in model.named_parameters()
               if p.requires_grad and fragment in name)


def test_attention_qv_on_a_llama_lists_q_and_v_groups_with_their_parameters():
    config = AdapterConfig(kind="lora", rank=4, targets=("attention-qv",),
                           trainable_modules=("norm",))
    model = lora.apply(llama(), config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # separate q and v projections: nothing to warn about
        found = adapter_map(model, config)
    q_count = trainable_numel(model, "self_attn.q_proj.lora_")
    v_count = trainable_numel(model, "self_attn.v_proj.lora_")
    assert found.adapted == (
        AdaptedGroup("model.layers.*.self_attn.q_proj", 2, q_count, fused_qkv=False),
        AdaptedGroup("model.layers.*.self_attn.v_proj", 2, v_count, fused_qkv=False))
    assert found.trained_in_full == (
        TrainedGroup("model.norm", trainable_numel(model, "model.norm.modules_to_save")),)
    assert found.trainable_parameters == trainable_numel(model, "")
    assert found.frozen_parameters == sum(p.numel() for p in model.parameters()
                                          if not p.requires_grad)
    text = found.to_text()
    assert f"model.layers.*.self_attn.q_proj: 2 modules, {q_count:,} adapter parameters" in text
    assert "model.norm: trained in full" in text
    assert json.loads(json.dumps(found.to_json()))["adapted"][1]["pattern"] == \
        "model.layers.*.self_attn.v_proj"


def test_attention_qv_on_fused_qkv_places_q_and_v_parts_and_does_not_warn():
    config = AdapterConfig(kind="lora", rank=4, targets=("attention-qv",))
    model = lora.apply(Autoencoder(depth=3), config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = adapter_map(model, config)
    assert found.adapted == (AdaptedGroup("encoder.blocks.*.attn.qkv", 3,
                                          trainable_numel(model, "attn.qkv.lora_"),
                                          fused_qkv=False, parts=("q", "v")),)
    assert "encoder.blocks.*.attn.qkv: 3 modules" in found.to_text()
    assert "parts q,v only" in found.to_text()


class _NeoXAttention(nn.Module):
    """GPT-NeoX's query_key_value interleaves q, k, v per head: no row blocks to place."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.ModuleDict({"query_key_value": nn.Linear(16, 48)})


def test_attention_qv_on_an_interleaved_fused_qkv_warns_in_one_line_and_says_so_in_the_map():
    config = AdapterConfig(kind="lora", rank=4, targets=("attention-qv",))
    model = lora.apply(_NeoXAttention(), config)
    with pytest.warns(UserWarning, match=r"attention-qv adapted fused q,k,v projections "
                                         r"\(attention\.query_key_value\) whole") as caught:
        found = adapter_map(model, config)
    assert "\n" not in str(caught[0].message)
    assert found.adapted == (AdaptedGroup("attention.query_key_value", 1,
                                          trainable_numel(model, "query_key_value.lora_"),
                                          fused_qkv=True),)
    assert "q,k,v fused: all three adapted" in found.to_text()


def test_a_fused_projection_named_in_targets_is_not_warned_about():
    config = AdapterConfig(kind="lora", rank=4, targets=("qkv",))
    model = lora.apply(Autoencoder(depth=3), config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert adapter_map(model, config).adapted[0].fused_qkv


def test_a_4bit_base_counts_its_frozen_weights_before_quantization():
    lora_config = AdapterConfig(kind="lora", rank=4, targets=("attention",))
    qlora_config = AdapterConfig(kind="qlora", rank=4, targets=("attention",))
    plain = lora.apply(Autoencoder(width=64), lora_config)
    quantized = Autoencoder(width=64)
    quantize.quantize_linears(quantized, qlora_config, Precision.FP32, skip=set())
    quantized = lora.apply(quantized, qlora_config)
    assert (adapter_map(quantized, qlora_config).frozen_parameters
            == adapter_map(plain, lora_config).frozen_parameters)
