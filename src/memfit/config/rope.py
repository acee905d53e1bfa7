"""``model.rope_scaling``: rotary positions stretched past a model's native window, by one of
the methods transformers implements (models/rope.py applies it to the model's config)."""

from __future__ import annotations

from dataclasses import dataclass

from memfit.config.choices import RopeScaling
from memfit.config.fields import doc


@dataclass(frozen=True)
class RopeScalingConfig:
    type: RopeScaling = doc(
        "How rotary positions reach past the model's native window, as transformers defines "
        "it: none; linear (positions divided by the factor); dynamic (NTK: the rotary base "
        "grows once a sequence passes the native window); yarn (NTK-by-parts and an "
        "attention temperature, with transformers' beta_fast 32 and beta_slow 1); llama3 "
        "(Llama 3.1's, see low_freq_factor and high_freq_factor). The context becomes the "
        "native window x model.rope_scaling.factor, and the run's config.json (model/, memfit "
        "merge) records it. For model.path and model.preset models with rotary embeddings "
        "(Llama, Mistral, Qwen2, Gemma-2, Phi-3), not GPT-2's learned positions.",
        default=RopeScaling.NONE,
    )
    factor: float | None = doc(
        "model.rope_scaling.type: how many times the native window the model's context "
        "becomes, a number above 1 (e.g. 4: a 32,768-token model trains on up to 131,072).",
        default=None,
    )
    low_freq_factor: float = doc(
        "type=llama3: rotary wavelengths longer than the native window / low_freq_factor are "
        "divided by the whole factor (Llama 3.1: 1).",
        default=1.0,
    )
    high_freq_factor: float = doc(
        "type=llama3: wavelengths shorter than the native window / high_freq_factor are kept "
        "as they are, those between the two bounds blended (Llama 3.1: 4).",
        default=4.0,
    )
