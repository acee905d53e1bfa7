"""Activation checkpointing on plain modules (block forwards wrapped in place) and on
Hugging Face models (non-reentrant, every k-th layer): same gradients, adapters still get
theirs, and the "did it apply?" check."""

from __future__ import annotations

import pytest
import torch
from technique_models import Autoencoder, reconstruction_loss
from transformers import AutoModelForCausalLM

from memfit._utils.errors import ConfigError
from memfit.config.schema import AdapterConfig, MemoryConfig
from memfit.models.presets import tiny_llama
from memfit.techniques import checkpointing, lora


def gradients(model, images):
    model.zero_grad()
    reconstruction_loss(model, images).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_default_blocks_are_the_repeated_ones_and_gradients_do_not_change():
    torch.manual_seed(0)
    model, images = Autoencoder(), torch.randn(2, 1, 8, 8)
    expected, keys = gradients(model, images), list(model.state_dict())
    checkpointing.apply(model, MemoryConfig(gradient_checkpointing=True), is_transformers=False)
    assert checkpointing.checkpointed_blocks(model) == 3  # encoder.blocks, not the MLPs
    checkpointing.check_applied(model)
    assert list(model.state_dict()) == keys  # names unchanged: exports still load
    actual = gradients(model, images)
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name])


@pytest.mark.parametrize("config, count", [
    (MemoryConfig(checkpoint_modules=("Block",), checkpoint_every=2), 2),
    (MemoryConfig(checkpoint_modules=("encoder.blocks.2", "decoder")), 2),
    (MemoryConfig(checkpoint_modules=("encoder", "encoder.blocks.*")), 1),  # outermost only
])
def test_blocks_by_class_or_name_and_every_kth(config, count):
    model = Autoencoder()
    checkpointing.apply(model, config, is_transformers=False)
    assert checkpointing.checkpointed_blocks(model) == count


def test_nothing_to_checkpoint_is_a_config_error():
    with pytest.raises(ConfigError, match="checkpoint_modules=\\['Nope'\\] matches no module"):
        checkpointing.apply(Autoencoder(), MemoryConfig(checkpoint_modules=("Nope",)), False)
    with pytest.raises(ConfigError, match="no nn.ModuleList or nn.Sequential"):
        checkpointing.apply(torch.nn.Linear(4, 4), MemoryConfig(), False)
    with pytest.raises(ConfigError, match="no block of this model is checkpointed"):
        checkpointing.check_applied(Autoencoder())


def test_adapters_on_a_frozen_base_still_get_gradients_through_checkpoints():
    torch.manual_seed(0)
    model = Autoencoder()
    checkpointing.apply(model, MemoryConfig(gradient_checkpointing=True), False)
    model = lora.apply(model, AdapterConfig(rank=4, targets=("attention-qv",)))
    reconstruction_loss(model, torch.randn(2, 1, 8, 8)).backward()
    lora.check_gradients_reached(model)
    assert all(p.grad is not None for n, p in model.named_parameters() if "lora_" in n)


def test_transformers_layers_every_kth_and_non_reentrant():
    model = AutoModelForCausalLM.from_config(tiny_llama())
    checkpointing.apply(model, MemoryConfig(checkpoint_every=2), is_transformers=True)
    assert checkpointing.checkpointed_blocks(model) == 1  # layer 0 of 2
    checkpointing.apply(model, MemoryConfig(), is_transformers=True)
    assert checkpointing.checkpointed_blocks(model) == 2
    # A reentrant setup does not count: it would cut adapter gradients off.
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    with pytest.raises(ConfigError):
        checkpointing.check_applied(model)


@pytest.mark.parametrize("memory, count", [
    (MemoryConfig(checkpoint_blocks=2), 2),
    (MemoryConfig(checkpoint_blocks=0.5), 2),  # 1.5 of 3 blocks, rounded up
    (MemoryConfig(checkpoint_blocks=1.0), 3),
    (MemoryConfig(checkpoint_blocks=3, checkpoint_every=2), 2),  # blocks 0 and 2
    (MemoryConfig(checkpoint_blocks=2, checkpoint_every=2), 1),  # block 0 of the first 2
    (MemoryConfig(checkpoint_blocks=0), 0),
])
def test_the_first_n_blocks_every_kth_within_them(memory, count):
    model = Autoencoder()
    checkpointing.apply(model, memory, is_transformers=False)
    assert checkpointing.checkpointed_blocks(model) == count
    checkpointing.check_applied(model, memory)  # 0 asked for, 0 found: applied


def test_transformers_first_n_layers():
    config = tiny_llama()
    config.num_hidden_layers = 4
    model = AutoModelForCausalLM.from_config(config)
    memory = MemoryConfig(checkpoint_blocks=3, checkpoint_every=2)
    checkpointing.apply(model, memory, is_transformers=True)
    assert [layer.gradient_checkpointing for layer in model.model.layers] == [
        True, False, True, False]
    checkpointing.check_applied(model, memory)
    with pytest.raises(ConfigError, match="should checkpoint 4 of this model's 4 blocks"):
        checkpointing.check_applied(model, MemoryConfig())
    with pytest.raises(ConfigError, match="memory.checkpoint_blocks=5 is beyond the 4 blocks "
                                          "of model.preset=x; choose 0..4 or a fraction"):
        checkpointing.apply(model, MemoryConfig(checkpoint_blocks=5), True, "model.preset=x")


def test_gradients_cut_off_from_adapters_are_detected():
    model = lora.apply(Autoencoder(), AdapterConfig(rank=4, targets=("conv",)))
    with torch.no_grad():
        output = model(torch.randn(2, 1, 8, 8))
    (output.sum() * torch.ones((), requires_grad=True)).backward()
    with pytest.raises(ConfigError, match="no gradient reached the LoRA adapters"):
        lora.check_gradients_reached(model)
