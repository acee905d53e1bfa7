"""The packed form of a bitsandbytes layer (techniques/quantized_shards.py) computes
exactly what the layer computes: outputs and input gradients bit for bit, in training and
evaluation, with and without autocast; and its one parameter holds every byte of the
layer's codes and scales."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from memfit.config.schema import AdapterConfig, BaseQuantization, Precision
from memfit.techniques import quantize
from memfit.techniques.quantized_shards import PackedQuantizedLinear, make_shardable

CASES = [(BaseQuantization.NF4, True, Precision.FP32),
         (BaseQuantization.NF4, False, Precision.BF16),
         (BaseQuantization.INT8, False, Precision.FP32)]


def _quantized_model(quantization: BaseQuantization, double_quant: bool,
                     precision: Precision) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 32, bias=False))
    config = AdapterConfig(kind="qlora", quantization=quantization, double_quant=double_quant)
    quantize.quantize_linears(model, config, precision, set())
    quantize.keep_training_layout(model)
    return model


@pytest.mark.parametrize(("quantization", "double_quant", "precision"), CASES)
def test_packed_layers_compute_what_bitsandbytes_computes(
        quantization: BaseQuantization, double_quant: bool, precision: Precision):
    model = _quantized_model(quantization, double_quant, precision)
    packed = copy.deepcopy(model)
    assert make_shardable(packed) == 2
    for training in (True, False):
        model.train(training)
        packed.train(training)
        inputs = torch.randn(3, 5, 64)
        outputs, grads = [], []
        for module in (model, packed):
            x = inputs.clone().requires_grad_()
            with torch.autocast("cpu", dtype=torch.bfloat16,
                                enabled=precision is Precision.BF16):
                y = module(x)
            y.float().square().sum().backward()
            outputs.append(y)
            grads.append(x.grad)
        assert torch.equal(outputs[0], outputs[1])
        assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize(("quantization", "double_quant", "precision"), CASES)
def test_the_packed_parameter_holds_every_byte_of_codes_and_scales(
        quantization: BaseQuantization, double_quant: bool, precision: Precision):
    layer = _quantized_model(quantization, double_quant, precision)[0]
    weight = layer.weight
    if quantization is BaseQuantization.INT8:
        tensors = [weight.data, quantize.int8_scales(layer)]
    else:
        state = weight.quant_state
        tensors = [weight.data, state.absmax, state.code]
        if double_quant:
            tensors += [state.state2.absmax, state.state2.code, state.offset]
    packed = PackedQuantizedLinear(layer)
    assert packed.packed.dtype == torch.uint8 and not packed.packed.requires_grad
    assert packed.packed.numel() == sum(t.nbytes for t in tensors)
