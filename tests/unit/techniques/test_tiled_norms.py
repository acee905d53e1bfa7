"""Tiled norms: the same loss and gradients as the untiled model (oracle: the same Llama
without tiling, fp32, full fine-tuning so the norms' weights train too), one gradient per
parameter and backward, a bf16 RMSNorm that saves only its input for backward (untiled it
saves an fp32 copy, twice the bytes), and a model without norms refused."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from memfit._utils.errors import ConfigError
from memfit.plan.planner import load_plan_config
from memfit.techniques.tiled_norms import NORMS

SEQUENCE = 4096


def test_tiled_norms_train_as_untiled_ones():
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQUENCE))
    for name, parameter in base.named_parameters():
        if "norm" in name:  # norms start at one, where every position's gradient is alike
            nn.init.normal_(parameter, mean=1.0, std=0.2)
    ids = torch.randint(0, 64, (1, SEQUENCE))

    def loss_and_grads(tiled: bool):
        model = copy.deepcopy(base)
        if tiled:
            NORMS.apply(model, chunk_tokens=1000)  # 4 chunks + a partial one
        accumulated: dict[str, int] = {}
        for name, parameter in model.named_parameters():
            parameter.register_post_accumulate_grad_hook(
                lambda p, name=name: accumulated.__setitem__(name, accumulated.get(name, 0) + 1))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        grads = {name: p.grad for name, p in model.named_parameters()}
        return loss.detach(), grads, accumulated, NORMS.tiled(model)

    plain, plain_grads, _, untiled = loss_and_grads(tiled=False)
    tiled, tiled_grads, accumulated, count = loss_and_grads(tiled=True)
    assert (untiled, count) == (0, 5)  # two per layer and the final one
    assert abs(tiled - plain) <= 1e-6 * abs(plain)
    for name, want in plain_grads.items():
        error = (tiled_grads[name] - want).norm() / want.norm()
        assert error <= 1e-5, (name, error.item())
    assert set(accumulated.values()) == {1} and set(accumulated) == set(plain_grads)


def saved_bytes(norm: nn.Module, hidden: torch.Tensor) -> tuple[int, set[int]]:
    """Bytes of what forward saves for backward, and the storages they are in."""
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = norm(hidden)
    output.sum().backward()  # (a tiled backward's chunk graphs live one chunk each)
    return sum(saved.values()), set(saved)


def test_a_tiled_bf16_rmsnorm_saves_only_its_input():
    norm = LlamaRMSNorm(64).to(torch.bfloat16)  # Llama's: computes in fp32
    hidden = torch.randn(1, 8192, 64, dtype=torch.bfloat16, requires_grad=True)
    untiled, _ = saved_bytes(norm, hidden)
    NORMS.apply(norm, chunk_tokens=1024)
    tiled, storages = saved_bytes(norm, hidden)
    assert storages == {hidden.data_ptr()} and tiled == hidden.nbytes
    assert untiled >= 2 * hidden.nbytes  # the fp32 copy of the input, at least


def test_a_model_without_norms_is_refused():
    with pytest.raises(ConfigError, match="memory.tiled_norms=true but no module"):
        NORMS.apply(nn.Sequential(nn.Linear(2, 2)), chunk_tokens=4)
    with pytest.raises(ConfigError, match="no norm of this model runs tiled"):
        NORMS.check_applied(nn.Sequential(nn.LayerNorm(2)))


@pytest.mark.parametrize("override, message", [
    ("memory.norm_chunk_tokens=0", r"memory.norm_chunk_tokens=0 is outside 1 to 16777216 "
                                   r"\(a key of tiled norms\)"),
    ("memory.tiled_norms=sometimes", "memory.tiled_norms must be true or false"),
])
def test_bad_values_of_the_keys_are_named(override, message):
    with pytest.raises(ConfigError, match=message):
        load_plan_config(None, ["model.preset=tiny-llama", override])


def test_norms_of_a_loaded_model_stay_tiled_through_train_and_eval(tmp_path):
    """transformers 5 kernelizes what it loads (the kernels package is one of its
    dependencies) and redoes it on train() / eval(), dropping forwards set on Llama's
    RMSNorm instances; memfit loads with its own forwards (models/torch_forwards.py), and
    tiling switches kernelization off in a model loaded elsewhere (a factory's)."""
    from memfit.config.schema import ModelConfig
    from memfit.models.load import load_model
    from memfit.models.tokenizers import BYTE_VOCAB_SIZE, byte_level_tokenizer

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(
        vocab_size=BYTE_VOCAB_SIZE, hidden_size=32, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2)).save_pretrained(tmp_path / "llama")
    byte_level_tokenizer().save_pretrained(tmp_path / "llama")
    for model in (load_model(ModelConfig(path=str(tmp_path / "llama"))).model,
                  # as a factory might load it, kernelized (tiling switches that off)
                  AutoModelForCausalLM.from_pretrained(tmp_path / "llama")):
        NORMS.apply(model, chunk_tokens=8)
        model.train()
        model.eval()
        model.train()
        assert NORMS.tiled(model) == 5
