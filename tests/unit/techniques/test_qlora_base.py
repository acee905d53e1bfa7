"""The frozen base's storage: bitsandbytes NF4 / int8 layers (really quantized, exact byte
counts, close to the fp32 layer), frozen weights in the compute dtype (bit-identical under
autocast), dequantization, and the "did it apply?" check."""

from __future__ import annotations

import pytest
import torch
from technique_models import Autoencoder
from torch import nn

from memfit._utils.errors import ConfigError
from memfit.config.schema import AdapterConfig, BaseQuantization, Precision
from memfit.techniques import quantize
from memfit.techniques.technique_options import TechniqueOptions


def storage_bytes(tensors) -> int:
    seen = {}
    for tensor in tensors:
        seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
    return sum(seen.values())


def quant_state_tensors(layer):
    state = layer.weight.quant_state
    found = [state.absmax, state.code]
    if state.nested:
        found += [state.state2.absmax, state.state2.code, state.offset]
    return found


@pytest.mark.parametrize("double_quant", [True, False])
def test_nf4_layers_hold_4bit_codes_of_the_predicted_size(double_quant):
    import bitsandbytes as bnb

    torch.manual_seed(0)
    model = Autoencoder(width=64)
    reference = {name: m.weight.detach().clone() for name, m in model.named_modules()
                 if type(m) is nn.Linear}
    config = AdapterConfig(kind="qlora", double_quant=double_quant)
    replaced = quantize.quantize_linears(model, config, Precision.FP32, skip={"decoder.out"})
    assert replaced == len(reference) - 1
    assert type(model.decoder.out) is nn.Linear  # kept
    assert quantize.check_applied(model) == []
    for name, original in reference.items():
        layer = model.get_submodule(name)
        if name == "decoder.out":
            continue
        assert isinstance(layer, bnb.nn.Linear4bit) and layer.weight.dtype == torch.uint8
        out_features, in_features = original.shape
        assert storage_bytes([layer.weight, *quant_state_tensors(layer)]) == \
            quantize.quantized_weight_bytes(out_features, in_features, config)


def test_int8_base_and_dequantize_match_the_quantized_layer():
    torch.manual_seed(0)
    linear = nn.Linear(64, 32)
    x = torch.randn(5, 64)
    for quantization in BaseQuantization:
        model = nn.Sequential(nn.Linear(64, 32))
        model[0].load_state_dict(linear.state_dict())
        config = AdapterConfig(kind="qlora", quantization=quantization)
        quantize.quantize_linears(model, config, Precision.FP32, skip=set())
        quantize.check_applied(model)
        with torch.no_grad():
            quantized_out = model(x)
            quantize.dequantize(model, torch.float32)
            assert type(model[0]) is nn.Linear
            torch.testing.assert_close(model(x), quantized_out, rtol=1e-3, atol=1e-3)
            error = (quantized_out - linear(x)).abs().max() / linear(x).abs().max()
        assert error < 0.2  # a quantized copy of the layer, not something else


def test_frozen_weights_in_compute_dtype_give_identical_autocast_results():
    torch.manual_seed(0)
    model = Autoencoder()
    model.requires_grad_(False)
    images = torch.randn(2, 1, 8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before = model(images)
    linear_bytes = sum(m.weight.nbytes + m.bias.nbytes for m in model.modules()
                       if type(m) in (nn.Linear, nn.Conv2d))
    assert quantize.store_frozen_in(model, torch.bfloat16) == linear_bytes // 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(model(images), before)


def test_tied_and_trainable_weights_keep_their_dtype():
    embedding = nn.Embedding(10, 8)
    head = nn.Linear(8, 10, bias=False)
    head.weight = embedding.weight  # tied, as in many LMs
    trainable = nn.Linear(8, 8)
    model = nn.ModuleDict({"embedding": embedding, "head": head, "trainable": trainable})
    embedding.weight.requires_grad_(False)
    assert quantize.store_frozen_in(model, torch.bfloat16) == 0
    assert head.weight.dtype == trainable.weight.dtype == torch.float32


def test_check_flags_unquantized_expert_weights_and_missing_quantization():
    class Experts(nn.Module):
        def __init__(self):
            super().__init__()
            self.router = nn.Linear(16, 4)
            self.weights = nn.Parameter(torch.randn(4, 16, 16), requires_grad=False)

    model = Experts()
    with pytest.raises(ConfigError, match="no layer was quantized"):
        quantize.check_applied(model)
    quantize.quantize_linears(model, AdapterConfig(kind="qlora"), Precision.FP32, skip=set())
    (warning,) = quantize.check_applied(model)
    assert "1 weights with 3 or more dimensions" in warning and "weights" in warning


def test_hugging_face_folder_loads_quantized_and_keeps_its_head(tmp_path):
    import bitsandbytes as bnb
    from transformers import AutoModelForCausalLM

    from memfit.models.presets import tiny_llama
    from memfit.techniques.config_checks import from_mapping
    from memfit.training.build import load_base, prepare_model

    AutoModelForCausalLM.from_config(tiny_llama()).save_pretrained(tmp_path / "base")
    config = from_mapping({"model": {"path": str(tmp_path / "base")},
                           "data": {"path": str(tmp_path)}, "precision": "bf16",
                           "adapter": {"kind": "qlora", "targets": ["attention-qv"]}})
    loaded = load_base(config)
    layers = [m for m in loaded.model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(layers) == 14  # 7 projections x 2 layers; the tied head stays an embedding
    assert layers[0].compute_dtype == torch.bfloat16
    model, warnings = prepare_model(loaded, TechniqueOptions.of(config))
    assert warnings == []
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}
