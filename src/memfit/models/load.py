"""Turn ``model.*`` into a model and (for language models) its tokenizer.

Three sources: a local Hugging Face folder (the Auto class chosen by ``model.task``) or a
GGUF file (models/gguf.py), a built-in preset, or a user factory
``"package.module:function"`` returning an nn.Module.
An image classifier (models/image_classifier.py) is built with ``model.labels`` as its
classes too, and shaped by data.images.
A sequence classifier is loaded with ``model.labels`` as its classes (a new head of that
size; ``training.build`` fills the labels in from the data before loading).
"""

from __future__ import annotations

import importlib
import importlib.util
import pickle
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from torch import nn

from memfit._utils.broken_imports import diagnose
from memfit._utils.errors import MemfitWarning, ModelError, first_line
from memfit.config.choices import RopeScaling
from memfit.config.rope import RopeScalingConfig
from memfit.config.schema import ImagesConfig, ModelConfig, ModelDtype, Task
from memfit.demo import DEMO_BASE
from memfit.models.classifier import head_names, label_arguments
from memfit.models.folder_checks import check_config_json, check_weight_files
from memfit.models.gguf import gguf_config, gguf_file, gguf_tokenizer, load_gguf_model
from memfit.models.image_classifier import (
    CLASSIFIER_PRESETS,
    check_image_config,
    load_image_classifier,
)
from memfit.models.presets import IMAGE_PRESETS, PRESETS, preset_names
from memfit.models.rope import rope_arguments, with_rope_scaling
from memfit.models.tokenizers import byte_level_tokenizer
from memfit.models.torch_forwards import torch_forwards

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


def load_model(config: ModelConfig, quantization_config: Any | None = None,
               images: ImagesConfig | None = None) -> LoadedModel:
    """``quantization_config``: a transformers BitsAndBytesConfig applied while loading a
    Hugging Face folder (built models are quantized afterwards by techniques.quantize).
    ``images``: data.images, whose channels and size shape the image presets. A language
    model's config gets model.rope_scaling (models/rope.py) before its model is built."""
    dtype = TORCH_DTYPES[config.dtype]
    if config.path and (file := gguf_file(Path(config.path))) is not None:
        return _from_gguf(file, config.task, dtype, quantization_config, config.rope_scaling)
    if config.path and config.task is Task.IMAGE_CLASSIFICATION:
        return _image_classifier_folder(Path(config.path), dtype, quantization_config,
                                        config.labels, images or ImagesConfig())
    if config.path:
        return _from_folder(Path(config.path), config.task, dtype, quantization_config,
                            config.labels, config.rope_scaling)
    if config.preset and (config.preset in IMAGE_PRESETS | CLASSIFIER_PRESETS
                          or config.task in (Task.AUTOENCODER, Task.IMAGE_CLASSIFICATION)):
        model = build_image_preset(config, images or ImagesConfig())
        return LoadedModel(model.to(dtype), None, is_transformers=False)
    if config.preset:
        return _from_preset(config.preset, dtype, quantization_config, config.rope_scaling)
    return _from_factory(config, dtype)


def import_object(reference: str, key: str) -> Any:
    """``"package.module:name"`` or ``"path/to/file.py:name"`` -> the object, or a
    ModelError naming ``key``."""
    module_name, _, attribute = reference.rpartition(":")
    try:
        module = (_import_file(Path(module_name)) if module_name.endswith(".py")
                  else importlib.import_module(module_name))
    except Exception as error:  # noqa: BLE001 -- import-time failures are the user module's
        broken = diagnose(error)  # unless an installed library it imports is broken
        raise ModelError(f"{key}={reference!r}: cannot import {module_name!r}: {broken}"
                         if broken else
                         f"{key}={reference!r}: cannot import {module_name!r} ({error})") from None
    if not hasattr(module, attribute):
        raise ModelError(f"{key}={reference!r}: module {module_name!r} has no {attribute!r}")
    return getattr(module, attribute)


def _import_file(file: Path) -> Any:
    # A file beside a config (e.g. an example's model.py) need not be on sys.path.
    spec = importlib.util.spec_from_file_location(file.stem, file)
    if spec is None or spec.loader is None or not file.is_file():
        raise FileNotFoundError(f"no Python file {file}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _auto_class(task: Task):
    import transformers

    classes = {Task.CAUSAL_LM: transformers.AutoModelForCausalLM}  # see _load_classifier
    if task not in classes:
        raise ModelError(f"model.path cannot load model.task={task}; use model.factory")
    return classes[task]


# Files that mean a folder ships its own tokenizer (a fallback would silently differ).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


def path_config(path: Path) -> Any:
    """The transformers config ``model.path`` describes (its config.json, or a GGUF file's
    metadata), without reading weights."""
    from transformers import AutoConfig

    file = gguf_file(path)
    if file is not None:
        return gguf_config(file)
    check_config_json(path)
    return AutoConfig.from_pretrained(path)


def _from_gguf(file: Path, task: Task, dtype: torch.dtype, quantization_config: Any | None,
               rope: RopeScalingConfig) -> LoadedModel:
    """A causal LM from a GGUF file, dequantized into ``dtype``; a 4-bit base is quantized
    after loading, as a preset's is (techniques.quantize): transformers does not combine
    GGUF with bitsandbytes."""
    if task is not Task.CAUSAL_LM:
        raise ModelError(f"model.path={file} is a GGUF file, which memfit loads as a language "
                         f"model (model.task=causal-lm), not model.task={task}")
    if quantization_config is not None:
        raise ModelError(f"model.path={file}: a GGUF file cannot be quantized while loading; "
                         "QLoRA quantizes it after (techniques.quantize)")
    scaled = _rope_arguments(rope, lambda: gguf_config(file), f"model.path={file}")
    model = load_gguf_model(file, _auto_class(task), dtype, scaled)
    tokenizer, _ = _checked_tokenizer(file, model.config.vocab_size)
    return LoadedModel(model, tokenizer, is_transformers=True)


def _rope_arguments(rope: RopeScalingConfig, read_config: Callable[[], Any], model: str
                    ) -> dict[str, Any]:
    """``rope_arguments`` of the config ``read_config`` reads, read only when there is a
    scaling to apply."""
    if rope.type is RopeScaling.NONE:
        return {}
    return rope_arguments(read_config(), rope, model)


def _from_folder(folder: Path, task: Task, dtype: torch.dtype, quantization_config: Any | None,
                 labels: tuple[str, ...], rope: RopeScalingConfig) -> LoadedModel:
    check_config_json(folder)
    check_weight_files(folder)
    # from_pretrained hands these to the folder's config, which the model is built from.
    scaled = _rope_arguments(rope, lambda: path_config(folder), f"model.path={folder}")
    classifies = task is Task.SEQUENCE_CLASSIFICATION
    if classifies and not labels:
        raise ModelError(f"model.path={folder}: model.task=sequence-classification needs "
                         "model.labels (the classes) before the model can be built")
    try:
        if classifies:
            model = _load_classifier(folder, labels, dtype=dtype,
                                     quantization_config=quantization_config, scaled=scaled)
        else:
            model = _auto_class(task).from_pretrained(folder, dtype=dtype,
                                                      quantization_config=quantization_config,
                                                      **scaled, **torch_forwards())
    except (OSError, ValueError, SafetensorError) as error:
        raise ModelError(f"model.path={folder}: cannot load the model "
                         f"({first_line(error)})") from None
    except pickle.UnpicklingError:  # transformers loads .bin with weights_only=True
        raise ModelError(f"model.path={folder}: a .bin weights file holds Python objects "
                         "besides tensors, which memfit never unpickles (they could run "
                         "code); use the model's safetensors weights") from None
    tokenizer, _ = _checked_tokenizer(folder, model.config.vocab_size)
    if classifies and model.config.pad_token_id is None:
        # Decoder classifiers (Llama, GPT-2) read the logits at the last token that is not
        # padding, and refuse batches without knowing which token pads.
        model.config.pad_token_id = tokenizer.pad_token_id
    return LoadedModel(model, tokenizer, is_transformers=True)


def _load_classifier(folder: Path, labels: tuple[str, ...], dtype: torch.dtype,
                     quantization_config: Any | None, scaled: dict[str, Any]) -> nn.Module:
    """A sequence classifier of ``labels`` from a folder that usually has no head yet.
    transformers' load report would list the head's weights as missing, which is what a
    new head is; weights missing anywhere else start random too, and are warned about."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as transformers_logging

    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        model, loading = AutoModelForSequenceClassification.from_pretrained(
            folder, dtype=dtype, quantization_config=quantization_config,
            output_loading_info=True, **label_arguments(labels), **scaled, **torch_forwards())
    finally:
        transformers_logging.set_verbosity(verbosity)
    head = set(head_names(model))
    elsewhere = sorted(key for key in loading["missing_keys"] if key.split(".")[0] not in head)
    if elsewhere:
        warnings.warn(
            f"model.path={folder}: {len(elsewhere)} weights outside the classification head "
            f"({', '.join(sorted(head))}) are not in the checkpoint and start random (e.g. "
            f"{elsewhere[0]}); with adapters they stay so unless adapter.trainable_modules "
            "names their modules", MemfitWarning, stacklevel=3)
    return model


def _from_preset(name: str, dtype: torch.dtype, quantization_config: Any | None,
                 rope: RopeScalingConfig) -> LoadedModel:
    from transformers import AutoModelForCausalLM

    if name == DEMO_BASE:
        from memfit.demo import demo_assets_dir

        return _from_folder(demo_assets_dir() / "base", Task.CAUSAL_LM, dtype,
                            quantization_config, (), rope)
    if name not in PRESETS:
        raise ModelError(f"model.preset={name!r} is not one of: {', '.join(preset_names())}")
    transformers_config = with_rope_scaling(PRESETS[name](), rope, f"model.preset={name}")
    model = AutoModelForCausalLM.from_config(transformers_config, dtype=dtype)
    return LoadedModel(model, byte_level_tokenizer(), is_transformers=True)


def _image_classifier_folder(folder: Path, dtype: torch.dtype, quantization_config: Any | None,
                             labels: tuple[str, ...], images: ImagesConfig) -> LoadedModel:
    """A Hugging Face image classifier of ``labels``; it has no tokenizer."""
    from transformers import AutoConfig

    check_config_json(folder)
    check_weight_files(folder)
    if not labels:
        raise ModelError(f"model.path={folder}: model.task=image-classification needs "
                         "model.labels (the classes) before the model can be built")
    try:
        check_image_config(folder, AutoConfig.from_pretrained(folder), images.channels,
                           images.size)
        model = load_image_classifier(folder, labels, dtype, quantization_config)
    except (OSError, ValueError, SafetensorError) as error:
        raise ModelError(f"model.path={folder}: cannot load an image classifier "
                         f"({first_line(error)})") from None
    except pickle.UnpicklingError:
        raise ModelError(f"model.path={folder}: a .bin weights file holds Python objects "
                         "besides tensors, which memfit never unpickles; use safetensors "
                         "weights") from None
    return LoadedModel(model, None, is_transformers=True)


def build_image_preset(config: ModelConfig, images: ImagesConfig) -> nn.Module:
    """An image preset shaped for ``data.images`` (channels, size): an autoencoder, or a
    classifier of model.labels' classes."""
    if config.preset in CLASSIFIER_PRESETS and config.task is Task.IMAGE_CLASSIFICATION:
        if not config.labels:
            raise ModelError(f"model.preset={config.preset} needs model.labels (the classes) "
                             "before it can be built")
        return CLASSIFIER_PRESETS[config.preset](images.channels, images.size or 0,
                                                 len(config.labels))
    if config.task is Task.IMAGE_CLASSIFICATION:
        raise ModelError(f"model.preset={config.preset!r} with model.task=image-classification: "
                         f"the image classifier presets are {', '.join(CLASSIFIER_PRESETS)} "
                         "(or give model.path, a Hugging Face image classifier, or "
                         "model.factory)")
    if config.preset not in IMAGE_PRESETS or config.task is not Task.AUTOENCODER:
        raise ModelError(f"model.preset={config.preset!r} with model.task={config.task}: the "
                         f"image presets ({', '.join(IMAGE_PRESETS)}) go with "
                         "model.task=autoencoder, which takes one of them or a model.factory")
    if images.size is None:
        raise ModelError(f"model.preset={config.preset} needs data.images.size (the side of "
                         "the square images it is built for)")
    return IMAGE_PRESETS[config.preset](images.channels, images.size)


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


def load_tokenizer(config: ModelConfig) -> Any | None:
    """The tokenizer ``load_model`` gives a language model, without building the model (the
    planner measures the data's rows with it); None for image presets and factories."""
    if config.path and config.task is Task.IMAGE_CLASSIFICATION:
        return None
    if config.path:
        file = gguf_file(Path(config.path))
        if file is None:
            check_config_json(Path(config.path))
        return _path_tokenizer(file or Path(config.path))[0]
    if config.preset == DEMO_BASE:
        from memfit.demo import demo_assets_dir

        return _folder_tokenizer(demo_assets_dir() / "base")[0]
    if config.preset in PRESETS and config.task not in (Task.AUTOENCODER,
                                                         Task.IMAGE_CLASSIFICATION):
        return byte_level_tokenizer()
    return None


def _checked_tokenizer(path: Path, vocab_size: int) -> tuple[Any, bool]:
    """``_path_tokenizer``, refusing a byte-level fallback the model's vocabulary cannot
    hold."""
    tokenizer, fallback = _path_tokenizer(path)
    if fallback and vocab_size < len(tokenizer):
        what = "no tokenizer metadata" if gguf_file(path) else "no tokenizer files"
        raise ModelError(f"model.path={path} has {what} and its vocabulary ({vocab_size}) is "
                         "too small for the byte-level fallback")
    return tokenizer, fallback


def _path_tokenizer(path: Path) -> tuple[Any, bool]:
    """``_folder_tokenizer`` of a folder, or a GGUF file's own tokenizer (the byte-level
    fallback when it has no vocabulary)."""
    file = gguf_file(path)
    if file is None:
        return _folder_tokenizer(path)
    tokenizer = gguf_tokenizer(file)
    fallback = tokenizer is None
    tokenizer = byte_level_tokenizer() if fallback else tokenizer
    _ensure_pad_token(tokenizer)
    return tokenizer, fallback


def _folder_tokenizer(folder: Path) -> tuple[Any, bool]:
    """(the folder's tokenizer, padding with eos when it has no pad token; whether it is the
    byte-level fallback, for a folder without tokenizer files). A damaged one is a
    ModelError."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except Exception as error:  # noqa: BLE001 -- tokenizers has its own error types
        present = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
        if present:  # the folder has a tokenizer, and it is damaged: never train without it
            raise ModelError(f"model.path={folder}: its tokenizer ({', '.join(present)}) "
                             f"cannot be loaded: {first_line(error)}") from None
        tokenizer, fallback = byte_level_tokenizer(), True
    else:
        fallback = False
    _ensure_pad_token(tokenizer)
    return tokenizer, fallback


def _ensure_pad_token(tokenizer: Any) -> None:
    """Padding needs an id; models without one pad with eos (padded labels are -100)."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
