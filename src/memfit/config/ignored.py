"""Keys that are set but have no effect under the rest of the config: each gets one
warning naming the key, its value and why, so a choice never silently does nothing.
(Combinations that cannot work at all are errors, in validate.py.)

A key counts as set when the user's mapping names it. A config.yaml that memfit wrote
(read back by ``--resume``) names every key, so in a mapping that names every key only
the values that differ from the default count as the user's choices.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, NamedTuple

from memfit._utils.errors import MemfitWarning
from memfit.config.choices import CLASSIFYING_TASKS, RopeScaling
from memfit.config.load import to_mapping
from memfit.config.schema import (
    AdapterConfig,
    AdapterKind,
    BaseQuantization,
    Config,
    DataFormat,
    NonfiniteAction,
    Precision,
    Task,
)


class IgnoredKeyWarning(MemfitWarning):
    """A key was set, but the rest of the config makes it do nothing."""


# Every adapter.* key but the kind: what adapter.kind=none leaves unread.
_ADAPTER_KEYS = tuple(f"adapter.{entry.name}" for entry in dataclasses.fields(AdapterConfig)
                      if entry.name != "kind")

class Rule(NamedTuple):
    """``keys`` are ignored when ``ignored(config)``, because ``why(config)``. A key ending in
    ".*" stands for its whole section."""

    keys: tuple[str, ...]
    ignored: Callable[[Config], bool]
    why: Callable[[Config], str]


# The rules of this package's keys; the optimizers' come from their specs
# (memfit.techniques.ignored_rules), passed in as ``more``.
_RULES: list[Rule] = [
    Rule(_ADAPTER_KEYS, lambda c: c.adapter.kind is AdapterKind.NONE,
     lambda c: "adapter.kind=none trains the weights themselves, without adapters"),
    Rule(("adapter.quantization", "adapter.double_quant"),
     lambda c: c.adapter.kind is AdapterKind.LORA,
     lambda c: "only adapter.kind=qlora quantizes the frozen base"),
    Rule(("adapter.double_quant",),
     lambda c: (c.adapter.kind is AdapterKind.QLORA
                and c.adapter.quantization is BaseQuantization.INT8),
     lambda c: "it quantizes nf4's block scales, and adapter.quantization=int8 has none"),
    Rule(("adapter.frozen_in_compute_dtype",),
     lambda c: (c.adapter.kind is not AdapterKind.NONE
                and c.precision not in (Precision.BF16, Precision.FP16)),
     lambda c: f"it applies with precision=bf16 or fp16, not {c.precision}"),
    Rule(("train.epochs",), lambda c: c.train.max_steps is not None,
     lambda c: f"train.max_steps={c.train.max_steps} decides how long the run is"),
    Rule(("train.max_consecutive_skips",),
     lambda c: c.train.on_nonfinite is not NonfiniteAction.SKIP,
     lambda c: f"it applies with train.on_nonfinite=skip, not {c.train.on_nonfinite}"),
    Rule(("data.pack",),
     lambda c: c.data.format not in (DataFormat.TEXT, DataFormat.INSTRUCTION, DataFormat.CHAT),
     lambda c: f"it applies with data.format=text, instruction or chat, not {c.data.format}"),
    Rule(("data.text_field",),
     lambda c: c.data.format not in (DataFormat.TEXT, DataFormat.CLASSIFICATION),
     lambda c: f"it applies with data.format=text or classification, not {c.data.format}"),
    Rule(("data.label_field",), lambda c: c.data.format is not DataFormat.CLASSIFICATION,
     lambda c: f"it applies with data.format=classification, not {c.data.format}"),
    Rule(("data.eval_fraction",), lambda c: c.data.eval_path is not None,
     lambda c: f"data.eval_path={c.data.eval_path} is the evaluation split"),
    Rule(("model.num_labels", "model.labels"),
     lambda c: c.model.task not in CLASSIFYING_TASKS,
     lambda c: "it applies with model.task=sequence-classification or image-classification, "
               f"not {c.model.task}"),
    Rule(("data.images.*",), lambda c: c.data.format is not DataFormat.IMAGES,
     lambda c: f"it applies with data.format=images, not {c.data.format}"),
    Rule(("data.images.target_contrast",), lambda c: c.model.task is Task.IMAGE_CLASSIFICATION,
     lambda c: "model.task=image-classification learns each image's class, not a target image"),
    Rule(("model.rope_scaling.low_freq_factor", "model.rope_scaling.high_freq_factor"),
     lambda c: c.model.rope_scaling.type is not RopeScaling.LLAMA3,
     lambda c: f"it applies with model.rope_scaling.type=llama3, not {c.model.rope_scaling.type}"),
    Rule(("model.reconstruction_loss",), lambda c: c.model.task is not Task.AUTOENCODER,
     lambda c: f"it applies with model.task=autoencoder, not {c.model.task}"),
]


def warn_ignored_keys(config: Config, raw: Mapping[str, Any], more: Iterable[Rule] = (),
                      own_defaults: Mapping[str, Any] | None = None) -> None:
    """One IgnoredKeyWarning per key that ``raw`` (the mapping ``config`` was built
    from) sets and ``config`` ignores, by this module's rules and ``more``;
    ``own_defaults``: the specs' own keys' defaults (chosen_keys)."""
    for message in ignored_keys(config, chosen_keys(config, raw, own_defaults), more):
        warnings.warn(message, IgnoredKeyWarning, stacklevel=3)


def ignored_keys(config: Config, chosen: Collection[str], more: Iterable[Rule] = ()
                 ) -> list[str]:
    """'KEY=VALUE is ignored: WHY' for each of the ``chosen`` dotted keys ``config`` ignores
    (the first reason that applies)."""
    values = flatten(to_mapping(config))
    rules = [*_RULES, *more]
    messages = []
    for key in sorted(chosen):
        for patterns, ignored, why in rules:
            if ignored(config) and any(_matches(key, pattern) for pattern in patterns):
                messages.append(f"{key}={_show(values[key])} is ignored: {why(config)}")
                break
    return messages


def chosen_keys(config: Config, raw: Mapping[str, Any],
                own_defaults: Mapping[str, Any] | None = None) -> set[str]:
    """The dotted keys of ``raw`` that are the user's choices (see the module docstring).
    A spec's own key counts as chosen in a mapping that names every key where it differs
    from its default in ``own_defaults`` (a run's config.yaml of a version whose schema
    still held the key names it at its default)."""
    given = set(flatten(raw))
    defaults = flatten(to_mapping(Config()))
    if not given >= defaults.keys():
        return given
    defaults.update(own_defaults or {})
    values = flatten(to_mapping(config))
    return {key for key in given if values.get(key) != defaults.get(key)}


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _matches(key: str, pattern: str) -> bool:
    return key.startswith(pattern[:-1]) if pattern.endswith(".*") else key == pattern


def _show(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(str(item) for item in value) + "]"
    return str(value).lower() if isinstance(value, bool) else str(value)
