"""model.task=image-classification: the built-in ``conv-classifier`` preset (a plain
nn.Module, random weights) and Hugging Face image classifiers from a folder
(``AutoModelForImageClassification``: ViT, ResNet, ConvNeXt, ...).

Either way ``forward`` takes the image batch, (batch, channels, size, size) in [0, 1] as
data/images.py makes it (a Hugging Face model as ``pixel_values``), and gives (batch,
classes) logits; the top-level ``classifier`` is the new head, trained in full beside
adapters (``models.classifier.head_names``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from memfit._utils.errors import MemfitWarning, ModelError
from memfit.models.autoencoders import ConvBlock
from memfit.models.classifier import head_names, label_arguments
from memfit.models.torch_forwards import torch_forwards


class ConvFeatures(nn.Module):
    """Strided-conv blocks, then the mean over positions: (B, C, S, S) -> (B, widths[-1])."""

    def __init__(self, channels: int, widths: tuple[int, ...]):
        super().__init__()
        ins = (channels, *widths[:-1])
        self.blocks = nn.Sequential(*(ConvBlock(i, o) for i, o in zip(ins, widths, strict=True)))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.blocks(images).mean(dim=(2, 3))


class ConvClassifier(nn.Module):
    """A small convolutional classifier: ``encoder`` (its ``blocks`` halve the resolution
    each), a linear ``embed`` of the pooled features, and the ``classifier`` head. Any
    image size works (the features are pooled)."""

    def __init__(self, channels: int = 1, num_labels: int = 2,
                 widths: tuple[int, ...] = (16, 32, 64), hidden: int = 64):
        super().__init__()
        self.encoder = ConvFeatures(channels, tuple(widths))
        self.embed = nn.Linear(widths[-1], hidden)
        self.classifier = nn.Linear(hidden, num_labels)
        for module in [*self.encoder.modules(), self.embed]:
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                # He initialisation: with torch's default the signal shrinks block by block,
                # and random-weight features of different images become nearly equal.
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                nn.init.zeros_(module.bias)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(F.silu(self.embed(self.encoder(images))))


def conv_classifier(channels: int, size: int, num_labels: int) -> ConvClassifier:
    """16-32-64 channels over three halvings, pooled, a 64-wide embedding, then the head
    (~30k parameters)."""
    del size  # pooled: any size
    return ConvClassifier(channels, num_labels)


# name -> builder(channels, size, classes), from data.images and the data's classes.
CLASSIFIER_PRESETS: dict[str, Callable[[int, int, int], nn.Module]] = {
    "conv-classifier": conv_classifier,
}


def load_image_classifier(folder: Path, labels: Sequence[str], dtype: torch.dtype,
                          quantization_config=None) -> nn.Module:
    """An image classifier of ``labels`` from a Hugging Face folder: a body alone, or a
    classifier whose head had other classes (e.g. ImageNet's 1000), which is then new.
    Weights missing outside the head start random, and are warned about."""
    from transformers import AutoModelForImageClassification
    from transformers.utils import logging as transformers_logging

    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        model, loading = AutoModelForImageClassification.from_pretrained(
            folder, dtype=dtype, quantization_config=quantization_config,
            output_loading_info=True, ignore_mismatched_sizes=True, **label_arguments(labels),
            **torch_forwards())
    finally:
        transformers_logging.set_verbosity(verbosity)
    head = set(head_names(model))
    elsewhere = sorted(key for key in [*loading["missing_keys"],
                                       *(item[0] for item in loading["mismatched_keys"])]
                       if key.split(".")[0] not in head)
    if elsewhere:
        warnings.warn(
            f"model.path={folder}: {len(elsewhere)} weights outside the classification head "
            f"({', '.join(sorted(head)) or 'none'}) are not in the checkpoint and start random "
            f"(e.g. {elsewhere[0]}); with adapters they stay so unless "
            "adapter.trainable_modules names their modules", MemfitWarning, stacklevel=3)
    return model


def check_image_config(folder: Path, transformers_config, channels: int, size: int | None
                       ) -> None:
    """ModelError when data.images does not make the pictures the folder's model takes."""
    wanted = getattr(transformers_config, "num_channels", None)
    if isinstance(wanted, int) and wanted != channels:
        raise ModelError(f"model.path={folder} takes {wanted}-channel images but "
                         f"data.images.channels={channels}; set data.images.channels={wanted}")
    side = getattr(transformers_config, "image_size", None)
    side = side[0] if isinstance(side, (list, tuple)) else side
    if getattr(transformers_config, "model_type", "") in _FIXED_SIZE and isinstance(side, int) \
            and size != side:
        raise ModelError(f"model.path={folder} takes {side}x{side} images (config.json "
                         f"image_size) but data.images.size={size}; set data.images.size={side}")


# Architectures whose position embeddings fix the input size (convolutional ones pool).
_FIXED_SIZE = ("vit", "deit", "beit", "data2vec-vision")
