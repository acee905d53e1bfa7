"""Tiled MLP: the same loss and gradients as the untiled model (oracle: the same model
without tiling, fp32, at 8,192 tokens), every trainable parameter's gradient accumulated
once per backward, dropout masks of forward reused by backward's recomputation, and a
model without MLP modules refused."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig

from memfit._utils.errors import ConfigError
from memfit.config.load import build_unvalidated
from memfit.config.schema import Config
from memfit.plan.planner import load_plan_config
from memfit.techniques import registry
from memfit.techniques.tiled_mlp import MLPS
from memfit.techniques.training_loss import TrainingLoss

SEQUENCE = 8192


def long_llama() -> nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=SEQUENCE)
    return AutoModelForCausalLM.from_config(config)


def prepared(model: nn.Module, tiled: bool) -> tuple[nn.Module, TrainingLoss]:
    """Checkpointing, LoRA on attention and MLP, chunked loss: as training builds it."""
    config = build_unvalidated(Config, {
        "model": {"preset": "tiny-llama"}, "precision": "fp32",
        "adapter": {"kind": "lora", "rank": 4, "targets": ["attention", "mlp"]},
        "memory": {"gradient_checkpointing": True, "chunked_loss": True,
                   "loss_chunk_tokens": 2048, "tiled_mlp": tiled, "mlp_chunk_tokens": 1000}})
    options = registry.TechniqueOptions.of(config)
    setting = registry.setting(model, options, is_transformers=True, device="cpu")
    torch.manual_seed(1)  # the same adapters in both runs
    model = registry.apply_stage("model", model, setting)
    assert registry.check_applied(model, options) == []
    for name, parameter in model.named_parameters():
        if "lora_B" in name:  # PEFT starts B at zero, where A would get no gradient
            nn.init.normal_(parameter, std=0.1)
    return model, TrainingLoss.of(config.model, config.memory)


def test_tiled_llama_trains_as_the_untiled_one():
    base = long_llama()
    batch = {"input_ids": torch.randint(0, 64, (1, SEQUENCE)), "attention_mask": None}
    batch["labels"] = batch["input_ids"].clone()

    def loss_and_grads(tiled: bool):
        model, loss = prepared(copy.deepcopy(base), tiled)
        accumulated: dict[str, int] = {}
        for name, parameter in model.named_parameters():
            if parameter.requires_grad:
                parameter.register_post_accumulate_grad_hook(
                    lambda p, name=name: accumulated.__setitem__(
                        name, accumulated.get(name, 0) + 1))
        value = loss.loss_sum(model, batch)
        value.backward()
        grads = {name: p.grad for name, p in model.named_parameters() if p.requires_grad}
        return value.detach(), grads, accumulated, MLPS.tiled(model)

    plain, plain_grads, _, untiled = loss_and_grads(tiled=False)
    tiled, tiled_grads, accumulated, tiled_count = loss_and_grads(tiled=True)
    assert (untiled, tiled_count) == (0, 2)
    assert abs(tiled - plain) <= 1e-5 * abs(plain)
    assert set(tiled_grads) == set(plain_grads)
    assert any(".mlp." in name for name in tiled_grads)  # adapters on gate/up/down train
    for name, want in plain_grads.items():
        error = (tiled_grads[name] - want).norm() / want.norm()
        assert error <= 1e-5, (name, error.item())
    # One gradient per parameter and backward, as layer-wise updates and DDP expect.
    assert set(accumulated.values()) == {1} and set(accumulated) == set(tiled_grads)


class FeedForwardMLP(nn.Module):
    """A factory model's own MLP, with dropout between its layers."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.up, self.down = nn.Linear(width, 3 * width), nn.Linear(3 * width, width)
        self.dropout = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.dropout(torch.relu(self.up(x))))


def test_backward_recomputes_with_the_dropout_masks_of_forward():
    torch.manual_seed(0)
    model = nn.Sequential(FeedForwardMLP()).double()
    x = torch.randn(2, 10, 8, dtype=torch.float64, requires_grad=True)
    seed = 1234
    # Oracle: the same chunks (3 tokens, row-major over batch and sequence) with autograd.
    torch.manual_seed(seed)
    flat = x.reshape(-1, 8)
    expected = torch.cat([model(flat[i:i + 3].unsqueeze(0))[0] for i in range(0, 20, 3)])
    expected_grads = torch.autograd.grad(expected.square().sum(), [x, *model.parameters()])
    MLPS.apply(model, chunk_tokens=3)
    torch.manual_seed(seed)
    output = model(x)
    grads = torch.autograd.grad(output.square().sum(), [x, *model.parameters()])
    torch.testing.assert_close(output.reshape(-1, 8), expected)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)


def test_short_inputs_run_untiled():
    model = nn.Sequential(FeedForwardMLP()).eval()
    x = torch.randn(1, 4, 8, requires_grad=True)
    expected = model(x)
    MLPS.apply(model, chunk_tokens=4)
    output = model(x)
    assert torch.equal(output, expected)
    assert "TiledBackward" not in type(output.grad_fn).__name__


def test_a_model_without_mlp_modules_is_refused():
    with pytest.raises(ConfigError, match="memory.tiled_mlp=true but no module"):
        MLPS.apply(nn.Sequential(nn.Linear(2, 2)), chunk_tokens=4)
    with pytest.raises(ConfigError, match="no MLP of this model runs tiled"):
        MLPS.check_applied(nn.Sequential(FeedForwardMLP()))


@pytest.mark.parametrize("override, message", [
    ("memory.mlp_chunk_tokens=0", r"memory.mlp_chunk_tokens=0 is outside 1 to 16777216 \(a "
                                  r"key of tiled MLP\)"),
    ("memory.mlp_chunk_tokens=1.5", "memory.mlp_chunk_tokens must be a whole number, got 1.5"),
    ("memory.tiled_mlp=sometimes", "memory.tiled_mlp must be true or false"),
])
def test_bad_values_of_the_keys_are_named(override, message):
    with pytest.raises(ConfigError, match=message):
        load_plan_config(None, ["model.preset=tiny-llama", override])
