"""Under autocast, LoRA adapters take their input uncast (techniques/lora.py,
uncast_inputs): the same loss and gradients, bit for bit, as PEFT's cast to fp32 and
back (oracle: the same model with the cast switched back on), and fewer bytes saved for
backward: q, k and v share their input instead of each saving a bf16 copy of it. Without
autocast the cast stays (fp32 adapters on a bf16 input would not multiply), and DoRA
layers keep it."""

from __future__ import annotations

import copy

import torch
from peft.tuners.lora import LoraLayer
from transformers import AutoModelForCausalLM, LlamaConfig

from memfit.config.schema import AdapterConfig
from memfit.techniques import lora

TOKENS, HIDDEN = 512, 64


def adapted(autocast: bool, dora: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(
        vocab_size=64, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2)).to(torch.bfloat16)
    config = AdapterConfig(kind="lora", rank=4, targets=("attention",), dora=dora)
    model = lora.apply(model, config, autocast=autocast)
    for name, parameter in model.named_parameters():
        if "lora_B" in name:  # PEFT starts B at zero, where A would get no gradient
            torch.nn.init.normal_(parameter, std=0.1)
    return model


def casts(model: torch.nn.Module) -> set[bool]:
    return {module.cast_input_dtype_enabled for module in model.modules()
            if isinstance(module, LoraLayer)}


def run(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, dict, int]:
    """Loss, adapter gradients, and the bytes of the storages forward saves for backward."""
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autocast("cpu", dtype=torch.bfloat16), \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads, sum(saved.values())


def test_uncast_adapters_train_bit_for_bit_as_cast_ones_with_fewer_bytes():
    uncast = adapted(autocast=True)
    cast = copy.deepcopy(uncast)
    for module in cast.modules():
        if isinstance(module, LoraLayer):
            module.cast_input_dtype_enabled = True  # PEFT's default
    assert casts(uncast) == {False}
    ids = torch.randint(0, 64, (1, TOKENS))
    loss, grads, uncast_bytes = run(uncast, ids)
    cast_loss, cast_grads, cast_bytes = run(cast, ids)
    assert torch.equal(loss, cast_loss)
    for name, grad in grads.items():
        assert torch.equal(grad, cast_grads[name]), name
    # Per block: q, k, v and o each saved a bf16 copy of its input; uncast, q, k and v
    # share the norm's output and o its input, which attention saves anyway.
    assert cast_bytes - uncast_bytes >= 2 * 3 * TOKENS * HIDDEN * 2, (cast_bytes, uncast_bytes)


def test_the_cast_stays_without_autocast_and_on_dora_layers():
    assert casts(adapted(autocast=False)) == {True}
    assert casts(adapted(autocast=True, dora=True)) == {True}
