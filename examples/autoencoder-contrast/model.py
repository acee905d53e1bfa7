"""The user's own model for this example, named by adapt.yaml as ``model.factory``.

``pretrained()`` builds the architecture of the ``conv-autoencoder`` preset for 32x32
grayscale images and loads the weights pretrain.py saved (a safetensors state dict,
loaded with ``strict=True``: every key must match).
"""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file
from torch import nn

from memfit.models.autoencoders import conv_autoencoder

WEIGHTS = Path(__file__).resolve().parent / "pretrained" / "model.safetensors"
CHANNELS, SIZE = 1, 32  # must match data.images in pretrain.yaml / adapt.yaml


def architecture() -> nn.Module:
    return conv_autoencoder(CHANNELS, SIZE)


def pretrained() -> nn.Module:
    if not WEIGHTS.is_file():
        raise FileNotFoundError(f"{WEIGHTS} is missing: run pretrain.py first")
    model = architecture()
    model.load_state_dict(load_file(WEIGHTS), strict=True)
    return model
