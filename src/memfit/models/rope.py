"""``model.rope_scaling`` applied to a transformers config, the way transformers 5 defines
each method (``modeling_rope_utils``): the config's ``rope_parameters`` name the method
(``rope_type``), its ``factor`` and, for yarn and llama3, the pretraining length
(``original_max_position_embeddings``) it scales from; the model's rotary embedding computes
its frequencies from them when it is built.

``max_position_embeddings`` becomes the native window x factor, except with dynamic: its
formula reads ``max_position_embeddings`` as the length where scaling starts, so that stays
the native window and the context is it x factor (``context``). The native window is the
length before any scaling the config already has (a folder scaled by memfit, or Llama 3.1's
own llama3 scaling): the configured method replaces that scaling, so applying the same
block again changes nothing.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from memfit._utils.errors import ConfigError
from memfit.config.choices import RopeScaling
from memfit.config.limits import MAX_TOKENS
from memfit.config.rope import RopeScalingConfig

# What the methods read from rope_parameters besides their own keys: kept when the method
# changes. Everything else there (factor, beta_fast, long_factor, ...) belongs to a method.
_KEPT = ("rope_theta", "partial_rotary_factor")
# Methods that scale from a recorded pretraining length rather than max_position_embeddings.
_RECORD_ORIGINAL = (RopeScaling.YARN, RopeScaling.LLAMA3)
_METHODS = frozenset(member.value for member in RopeScaling if member is not RopeScaling.NONE)
_SUGGESTED = RopeScaling.YARN  # the hint's method for a model with no scaling of its own


def has_rope(transformers_config: Any) -> bool:
    """Whether the config's model has rotary position embeddings to scale."""
    return bool(getattr(transformers_config, "rope_parameters", None))


def context(transformers_config: Any) -> tuple[str, int] | None:
    """(where the context length comes from, in words; the length) of a RoPE model's config;
    None for one without rotary embeddings or with them per layer type."""
    if not has_rope(transformers_config) or _nested(transformers_config):
        return None
    positions = transformers_config.max_position_embeddings
    parameters = transformers_config.rope_parameters
    if parameters.get("rope_type") == RopeScaling.DYNAMIC.value:
        factor = parameters["factor"]
        return "max_position_embeddings x rope_parameters.factor", int(positions * factor)
    return "max_position_embeddings", positions


def rope_arguments(transformers_config: Any, scaling: RopeScalingConfig, model: str
                   ) -> dict[str, Any]:
    """The config attributes that give ``transformers_config`` the scaling (``{}`` when it is
    none): keyword arguments ``from_pretrained`` hands its config, or attributes to set.
    ``model`` names the model (``model.preset=gpt2``) in the ConfigError of one that cannot
    be scaled or whose scaled window is absurd."""
    if scaling.type is RopeScaling.NONE:
        return {}
    where = f"model.rope_scaling.type={scaling.type}"
    if not has_rope(transformers_config):
        raise ConfigError(f"{where}: {model} has no rotary position embeddings to scale (its "
                          "positions are learned or absent); set model.rope_scaling.type=none")
    layer_types = _nested(transformers_config)
    if layer_types:
        raise ConfigError(f"{where}: {model} keeps rotary parameters per layer type "
                          f"({', '.join(layer_types)}), which memfit does not scale; set "
                          "model.rope_scaling.type=none")
    original = native_window(transformers_config)
    window = int(original * scaling.factor)
    if window > MAX_TOKENS:
        raise ConfigError(f"model.rope_scaling.factor={scaling.factor} makes {model}'s "
                          f"{original:,}-token window {window:,} tokens, beyond memfit's limit "
                          f"of {MAX_TOKENS:,}")
    old = transformers_config.rope_parameters
    parameters = {key: old[key] for key in _KEPT if key in old}
    parameters.update(rope_type=scaling.type.value, factor=scaling.factor)
    if scaling.type in _RECORD_ORIGINAL:
        parameters["original_max_position_embeddings"] = original
    if scaling.type is RopeScaling.LLAMA3:
        parameters.update(low_freq_factor=scaling.low_freq_factor,
                          high_freq_factor=scaling.high_freq_factor)
    arguments: dict[str, Any] = {
        "rope_parameters": parameters,
        "max_position_embeddings": original if scaling.type is RopeScaling.DYNAMIC else window}
    if hasattr(transformers_config, "original_max_position_embeddings"):
        # Phi-3 keeps the pretraining length beside rope_parameters, and transformers
        # prefers it there over rope_parameters' own.
        arguments["original_max_position_embeddings"] = original
    return arguments


def with_rope_scaling(transformers_config: Any, scaling: RopeScalingConfig, model: str) -> Any:
    """A copy of ``transformers_config`` with the scaling (``rope_arguments``); the config
    itself when the scaling is none."""
    arguments = rope_arguments(transformers_config, scaling, model)
    if not arguments:
        return transformers_config
    scaled = copy.deepcopy(transformers_config)
    for key, value in arguments.items():
        setattr(scaled, key, value)
    return scaled


def native_window(transformers_config: Any) -> int:
    """The positions the model had before any scaling its config records: the recorded
    pretraining length (yarn, llama3, longrope; Phi-3's attribute), max_position_embeddings
    / factor under linear scaling (which grew it), else max_position_embeddings."""
    parameters = transformers_config.rope_parameters
    positions = transformers_config.max_position_embeddings
    recorded = (getattr(transformers_config, "original_max_position_embeddings", None)
                or parameters.get("original_max_position_embeddings"))
    if recorded:
        return int(recorded)
    if parameters.get("rope_type") == RopeScaling.LINEAR.value:
        return round(positions / parameters["factor"])
    return positions


def suggestion(transformers_config: Any, needed: int | None = None) -> str | None:
    """The model.rope_scaling overrides that take the model to ``needed`` tokens (None: four
    times its context), as a power-of-two factor; None for a model that cannot be scaled."""
    found = context(transformers_config)
    if found is None:
        return None
    own = transformers_config.rope_parameters.get("rope_type")
    method = own if own in _METHODS else _SUGGESTED
    target = needed if needed is not None else 4 * found[1]
    factor = 2 ** max(1, math.ceil(math.log2(target / native_window(transformers_config))))
    return f"model.rope_scaling.type={method} model.rope_scaling.factor={factor}"


def _nested(transformers_config: Any) -> list[str]:
    """The layer types a config keeps separate rotary parameters for (Gemma-3); [] for one
    set."""
    keys = getattr(transformers_config, "nested_rope_parameter_keys", None)
    return keys(transformers_config.rope_parameters) if keys is not None else []
