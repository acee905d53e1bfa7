"""``data.max_length`` against the model's context length, checked before a model is
built or traced: positions beyond the context either fail deep inside the model or are
planned and trained as if they were meaningful."""

from __future__ import annotations

from memfit._utils.errors import ConfigError
from memfit.config.schema import Config
from memfit.plan import meta

# Where transformers configs keep the longest sequence the model was built for (GPT-2's
# n_positions is also readable as max_position_embeddings).
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def context_length(config: Config) -> tuple[str, int] | None:
    """(the config key it is read from, its value) for model.path / model.preset models;
    None for factories and configs that name no context length."""
    transformers_config = meta.hf_config(config)
    if transformers_config is None:
        return None
    for key in CONTEXT_KEYS:
        value = getattr(transformers_config, key, None)
        if isinstance(value, int) and value > 0:
            return key, value
    return None


def check_max_length(config: Config) -> None:
    """Raise a ConfigError naming both numbers when data.max_length exceeds the context."""
    found = context_length(config)
    if found is None or config.data.max_length <= found[1]:
        return
    key, context = found
    model = (f"model.path={config.model.path}" if config.model.path
             else f"model.preset={config.model.preset}")
    raise ConfigError(
        f"data.max_length={config.data.max_length} is beyond the context of {model} "
        f"({key}={context}); set data.max_length to {context} or less")
