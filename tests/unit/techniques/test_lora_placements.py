"""adapter.targets placements for encoder-decoder models: encoder, encoder-late, decoder."""

from __future__ import annotations

import pytest
from torch import nn

from memfit._utils.errors import ConfigError
from memfit.config.schema import AdapterConfig
from memfit.models.autoencoders import ConvAutoencoder, VitAutoencoder
from memfit.techniques import lora


def targets(model: nn.Module, *names: str, restrict_to: tuple[str, ...] = ()) -> list[str]:
    return lora.resolve_targets(model, AdapterConfig(targets=names, restrict_to=restrict_to))


def test_conv_autoencoder_placements():
    model = ConvAutoencoder(channels=1, size=16)  # 3 encoder blocks, then to_latent
    assert targets(model, "encoder-late") == [
        "encoder.blocks.1.down", "encoder.blocks.1.conv", "encoder.blocks.2.down",
        "encoder.blocks.2.conv", "encoder.to_latent"]
    assert targets(model, "decoder") == [
        "decoder.from_latent", "decoder.blocks.0.conv", "decoder.blocks.1.conv",
        "decoder.blocks.2.conv", "decoder.head"]
    assert len(targets(model, "encoder")) == 7
    # Placements combine with kinds and with restrict_to like any other target.
    assert targets(model, "encoder-late", "decoder", restrict_to=("decoder",)) == targets(
        model, "decoder")
    assert targets(model, "conv", restrict_to=("encoder.blocks.2",)) == [
        "encoder.blocks.2.down", "encoder.blocks.2.conv"]


@pytest.mark.parametrize("depth, late", [(4, (2, 3)), (2, (1,))])
def test_vit_encoder_late_is_the_later_half_of_the_blocks(depth, late):
    # With depth 2 the block list (2 items) must still win over each block's 3-item mlp.
    model = VitAutoencoder(channels=1, size=8, depth=depth)
    chosen = targets(model, "encoder-late")
    blocks = sorted({int(name.split(".")[2]) for name in chosen})
    assert tuple(blocks) == late
    assert len(chosen) == 6 * len(late)  # query, key, value, out, fc1, fc2 per block


def test_a_plain_sequential_encoder_is_its_own_block_stack():
    model = nn.Module()
    model.encoder = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3),
                                  nn.ReLU(), nn.Conv2d(4, 4, 3), nn.Conv2d(4, 4, 1))
    model.decoder = nn.Conv2d(4, 1, 1)
    assert targets(model, "encoder-late") == ["encoder.4", "encoder.5"]
    assert targets(model, "decoder") == ["decoder"]


def test_a_model_without_an_encoder_names_its_parts():
    model = nn.Sequential(nn.Linear(2, 2))
    model.add_module("head", nn.Linear(2, 2))
    with pytest.raises(ConfigError, match="encoder-late needs a module named 'encoder'; this "
                                          "model's top-level parts are: 0, head"):
        targets(model, "encoder-late")
    with pytest.raises(ConfigError, match="valid kinds: .*conv, encoder, encoder-late, decoder"):
        targets(ConvAutoencoder(size=8, widths=(4,)), "attention-qv")
