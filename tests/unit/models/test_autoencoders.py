"""The image autoencoder presets: built through model.preset for data.images' shape, their
module layout (what LoRA placements and checkpointing rely on), LoRA on their convs and
attention through PEFT, and the errors a user sees."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memfit._utils.errors import ModelError
from memfit.config.schema import (
    AdapterConfig,
    ImagesConfig,
    MemoryConfig,
    ModelConfig,
    Task,
)
from memfit.models.autoencoders import IMAGE_PRESETS, ConvAutoencoder
from memfit.models.load import load_model
from memfit.models.presets import preset_names
from memfit.techniques import checkpointing, lora


def preset(name: str, channels: int = 1, size: int = 16) -> nn.Module:
    torch.manual_seed(0)
    config = ModelConfig(preset=name, task=Task.AUTOENCODER)
    loaded = load_model(config, images=ImagesConfig(size=size, channels=channels))
    assert loaded.tokenizer is None and not loaded.is_transformers
    return loaded.model


@pytest.mark.parametrize("name", sorted(IMAGE_PRESETS))
@pytest.mark.parametrize("channels", [1, 3])
def test_presets_reconstruct_images_of_the_configured_shape(name, channels):
    model = preset(name, channels)
    images = torch.rand(2, channels, 16, 16)
    assert model(images).shape == images.shape
    assert name in preset_names()
    # PEFT has no LoRA for transposed convolutions; every learned map must be adaptable.
    assert not any(isinstance(m, nn.ConvTranspose2d) for m in model.modules())


def test_vit_attention_has_separate_query_key_value_linears():
    model = preset("vit-autoencoder")
    attention = model.encoder.blocks[0].attn
    assert all(isinstance(getattr(attention, part), nn.Linear)
               for part in ("query", "key", "value", "out"))
    qv = lora.resolve_targets(model, AdapterConfig(targets=("attention-qv",)))
    assert len(qv) == 2 * (len(model.encoder.blocks) + len(model.decoder.blocks))


@pytest.mark.parametrize("name", sorted(IMAGE_PRESETS))
def test_lora_on_a_preset_starts_as_the_base_and_trains_only_adapters(name):
    model = preset(name)
    images = torch.rand(2, 1, 16, 16)
    before = model(images).detach()
    adapted = lora.apply(model, AdapterConfig(rank=2, targets=("encoder-late", "decoder")))
    lora.check_applied(adapted)
    torch.testing.assert_close(adapted(images), before)  # B = 0 at initialisation
    ((adapted(images) - images) ** 2).mean().backward()
    trained = [n for n, p in adapted.named_parameters() if p.grad is not None]
    assert trained and all("lora_" in n for n in trained)
    if name == "conv-autoencoder":  # PEFT's Conv2d LoRA layer wraps the decoder convs
        assert any(type(m).__name__ == "Conv2d" and hasattr(m, "lora_A")
                   for m in adapted.modules())


@pytest.mark.parametrize("name", sorted(IMAGE_PRESETS))
def test_checkpointing_finds_the_block_stack_and_keeps_results(name):
    model = preset(name)
    images = torch.rand(2, 1, 16, 16)
    expected = model(images)
    expected.square().mean().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    checkpointing.apply(model, MemoryConfig(gradient_checkpointing=True), is_transformers=False)
    assert checkpointing.checkpointed_blocks(model) == len(model.encoder.blocks)
    actual = model(images)
    actual.square().mean().backward()
    torch.testing.assert_close(actual, expected)
    for grad, parameter in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(parameter.grad, grad)


def test_preset_errors_name_the_key_and_what_would_work():
    with pytest.raises(ModelError, match="conv-autoencoder needs data.images.size"):
        load_model(ModelConfig(preset="conv-autoencoder", task=Task.AUTOENCODER),
                   images=ImagesConfig())
    with pytest.raises(ModelError, match="image size 20 must be divisible by 8"):
        load_model(ModelConfig(preset="conv-autoencoder", task=Task.AUTOENCODER),
                   images=ImagesConfig(size=20))
    with pytest.raises(ModelError, match="go with model.task=autoencoder"):
        load_model(ModelConfig(preset="vit-autoencoder"), images=ImagesConfig(size=16))
    with pytest.raises(ModelError, match="'tiny-llama' with model.task=autoencoder"):
        load_model(ModelConfig(preset="tiny-llama", task=Task.AUTOENCODER))


def test_a_custom_conv_autoencoder_round_trips_its_state_dict():
    torch.manual_seed(0)
    model = ConvAutoencoder(channels=1, size=8, widths=(4, 8), latent=6)
    copy = ConvAutoencoder(channels=1, size=8, widths=(4, 8), latent=6)
    copy.load_state_dict(model.state_dict(), strict=True)
    images = torch.rand(1, 1, 8, 8)
    torch.testing.assert_close(copy(images), model(images))
