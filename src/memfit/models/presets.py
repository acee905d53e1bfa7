"""Built-in models: small architectures built from configs (random weights, for tests and
examples) and the shipped pretrained demo base.

A preset is a function returning a ``transformers`` config; weights are created by the
caller (on the meta device for planning, or for real for training).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from memfit.demo import DEMO_BASE
from memfit.models.architectures import ARCHITECTURES
from memfit.models.autoencoders import IMAGE_PRESETS
from memfit.models.image_classifier import CLASSIFIER_PRESETS
from memfit.models.tokenizers import BYTE_VOCAB_SIZE

if TYPE_CHECKING:
    from transformers import LlamaConfig, PretrainedConfig


def tiny_llama() -> LlamaConfig:
    """Llama architecture small enough for a training step in well under a second on CPU:
    hidden 64, 2 layers, 4 heads (2 KV heads), byte-level vocabulary (~0.1M parameters)."""
    from transformers import LlamaConfig  # ~2.5 s: only when a preset is built

    return LlamaConfig(
        vocab_size=BYTE_VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


# name -> config builder. The demo base is not here: it ships with weights (see models.load);
# nor are the image autoencoders and classifiers, plain nn.Modules (IMAGE_PRESETS,
# models.autoencoders; CLASSIFIER_PRESETS, models.image_classifier).
PRESETS: dict[str, Callable[[], PretrainedConfig]] = {
    "tiny-llama": tiny_llama,
    **ARCHITECTURES,  # published sizes, for planning (see models.architectures)
}


def preset_names() -> list[str]:
    return sorted([*PRESETS, *IMAGE_PRESETS, *CLASSIFIER_PRESETS, DEMO_BASE])
