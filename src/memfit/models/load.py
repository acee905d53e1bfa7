"""Turn ``model.*`` into a model and (for language models) its tokenizer.

Three sources: a local Hugging Face folder (the Auto class chosen by ``model.task``), a
built-in preset, or a user factory ``"package.module:function"`` returning an nn.Module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memfit._utils.errors import ModelError
from memfit.config.schema import ModelConfig, ModelDtype, Task
from memfit.models.presets import DEMO_BASE, PRESETS, preset_names
from memfit.models.tokenizers import byte_level_tokenizer

TORCH_DTYPES = {
    ModelDtype.FLOAT32: torch.float32,
    ModelDtype.BFLOAT16: torch.bfloat16,
    ModelDtype.FLOAT16: torch.float16,
}


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: Any | None  # a transformers tokenizer for language models, else None
    is_transformers: bool  # a transformers PreTrainedModel (HF checkpointing, save_pretrained)
    loss_function: Callable[[Any, dict], torch.Tensor] | None = None  # model.loss, if named


def load_model(config: ModelConfig) -> LoadedModel:
    dtype = TORCH_DTYPES[config.dtype]
    if config.path:
        return _from_folder(Path(config.path), config.task, dtype)
    if config.preset:
        return _from_preset(config.preset, dtype)
    return _from_factory(config, dtype)


def import_object(reference: str, key: str) -> Any:
    """``"package.module:name"`` -> the object, or a ModelError naming ``key``."""
    module_name, _, attribute = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 -- import-time failures are the user module's
        raise ModelError(f"{key}={reference!r}: cannot import {module_name!r} ({error})") from None
    if not hasattr(module, attribute):
        raise ModelError(f"{key}={reference!r}: module {module_name!r} has no {attribute!r}")
    return getattr(module, attribute)


def _auto_class(task: Task):
    import transformers

    classes = {
        Task.CAUSAL_LM: transformers.AutoModelForCausalLM,
        Task.SEQUENCE_CLASSIFICATION: transformers.AutoModelForSequenceClassification,
    }
    if task not in classes:
        raise ModelError(f"model.path cannot load model.task={task}; use model.factory")
    return classes[task]


def _from_folder(folder: Path, task: Task, dtype: torch.dtype) -> LoadedModel:
    from transformers import AutoTokenizer

    if not (folder / "config.json").is_file():
        raise ModelError(f"model.path={folder} is not a Hugging Face model folder (no config.json)")
    try:
        model = _auto_class(task).from_pretrained(folder, dtype=dtype)
    except (OSError, ValueError) as error:
        raise ModelError(f"model.path={folder}: cannot load the model ({error})") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError, TypeError):
        tokenizer = byte_level_tokenizer()
        if model.config.vocab_size < len(tokenizer):
            raise ModelError(
                f"model.path={folder} has no tokenizer files and its vocabulary "
                f"({model.config.vocab_size}) is too small for the byte-level fallback"
            ) from None
    _ensure_pad_token(tokenizer)
    return LoadedModel(model, tokenizer, is_transformers=True)


def _from_preset(name: str, dtype: torch.dtype) -> LoadedModel:
    from transformers import AutoModelForCausalLM

    if name == DEMO_BASE:
        from memfit.demo import demo_assets_dir

        return _from_folder(demo_assets_dir() / "base", Task.CAUSAL_LM, dtype)
    if name not in PRESETS:
        raise ModelError(f"model.preset={name!r} is not one of: {', '.join(preset_names())}")
    model = AutoModelForCausalLM.from_config(PRESETS[name](), dtype=dtype)
    return LoadedModel(model, byte_level_tokenizer(), is_transformers=True)


def _from_factory(config: ModelConfig, dtype: torch.dtype) -> LoadedModel:
    factory = import_object(config.factory, "model.factory")
    try:
        model = factory()
    except Exception as error:  # noqa: BLE001 -- the user's factory failed; say where
        raise ModelError(f"model.factory={config.factory!r} raised {error!r}") from None
    if not isinstance(model, nn.Module):
        raise ModelError(
            f"model.factory={config.factory!r} returned {type(model).__name__}, not an nn.Module"
        )
    loss_function = import_object(config.loss, "model.loss") if config.loss else None
    return LoadedModel(model.to(dtype), None, is_transformers=False, loss_function=loss_function)


def _ensure_pad_token(tokenizer: Any) -> None:
    """Padding needs an id; models without one pad with eos (padded labels are -100)."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
