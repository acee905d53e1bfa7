"""``data.max_length`` against the model's context length, checked before a model is
built or traced: positions beyond the context either fail deep inside the model or are
planned and trained as if they were meaningful. With model.rope_scaling the context is the
scaled one (models/rope.py); without it, the way past a RoPE model's window is named."""

from __future__ import annotations

from memfit._utils.errors import ConfigError
from memfit.config.choices import RopeScaling
from memfit.config.schema import ModelConfig
from memfit.models import rope
from memfit.plan import meta

# Where transformers configs keep the longest sequence the model was built for (GPT-2's
# n_positions is also readable as max_position_embeddings).
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def context_length(model: ModelConfig) -> tuple[str, int] | None:
    """(where it is read from, its value) for model.path / model.preset models, with
    model.rope_scaling applied; None for factories and configs that name no context
    length."""
    transformers_config = meta.hf_config(model)
    if transformers_config is None:
        return None
    found = rope.context(transformers_config)
    if found is not None:
        return found
    for key in CONTEXT_KEYS:
        value = getattr(transformers_config, key, None)
        if isinstance(value, int) and value > 0:
            return key, value
    return None


def beyond_context(model: ModelConfig, needed: int | None = None) -> str | None:
    """The model.rope_scaling overrides that extend the context to ``needed`` tokens (None:
    four times it); None when the config scales already or its model has no RoPE."""
    if model.rope_scaling.type is not RopeScaling.NONE:
        return None
    transformers_config = meta.hf_config(model)
    return None if transformers_config is None else rope.suggestion(transformers_config, needed)


def check_max_length(model: ModelConfig, length: int) -> None:
    """Raise a ConfigError naming both numbers when data.max_length (``length``) exceeds
    the context."""
    found = context_length(model)
    if found is None or length <= found[1]:
        return
    key, context = found
    named = f"model.path={model.path}" if model.path else f"model.preset={model.preset}"
    if model.rope_scaling.type is not RopeScaling.NONE:
        beyond = ", or a larger model.rope_scaling.factor"
    else:
        hint = beyond_context(model, length)
        beyond = f", or extend the context with {hint}" if hint else ""
    raise ConfigError(
        f"data.max_length={length} is beyond the context of {named} ({key}={context}); set "
        f"data.max_length to {context} or less{beyond}")
