"""The model of a Config on the ``meta`` device, with the config's techniques applied.

Built from the same sources as training (an HF ``config.json`` or a GGUF file's metadata,
a preset, a factory) and
through the same technique list (``techniques.registry``: checkpointing, LoRA, frozen
weights in the compute dtype, each technique's planner view), so parameter shapes, dtypes
and which ones train are the real ones; nothing is allocated. A 4-bit base cannot be
quantized without data, so QLoRA's bitsandbytes layers are stood in for by
``techniques.quantize_stand_in.QuantizedLinear``.

A factory runs under the meta device with ``from_pretrained`` building from the folder's
``config.json`` (``plan.pretrained_on_meta``), so wrapping a pretrained model plans too.
It runs once per factory (and version of its file): every strategy planned starts from a
copy of that meta model, as building it may take a while (a ``from_pretrained`` reading
config files, a ``load_state_dict`` reading a weight file only to drop it on meta).

Hugging Face models can be built with fewer layers (``layers=``) so the planner can trace
activations of a 70B model in seconds and extrapolate per layer.

A classifier (text or image) gets the head training would give it: the classes of
``models.classifier.with_classes`` when data.path is set (else model.labels,
model.num_labels, or the folder's own config), trained in full beside adapters.
"""

from __future__ import annotations

import copy
import functools
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from memfit._utils.errors import ModelError
from memfit.config.choices import CLASSIFYING_TASKS
from memfit.config.images import ImagesConfig
from memfit.config.schema import Config, DistributedStrategy, ModelConfig, Task
from memfit.demo import DEMO_BASE
from memfit.models.classifier import classified, label_arguments
from memfit.models.image_classifier import CLASSIFIER_PRESETS
from memfit.models.load import build_image_preset, import_object, path_config
from memfit.models.presets import IMAGE_PRESETS, PRESETS, preset_names
from memfit.models.rope import with_rope_scaling
from memfit.plan.pretrained_on_meta import from_pretrained_on_meta
from memfit.techniques import registry
from memfit.techniques.quantize_stand_in import QuantizedLinear


@dataclass
class MetaModel:
    model: nn.Module
    is_transformers: bool
    layers: int | None  # depth of the repeated block stack of an HF model; None: factory


def hf_config(model: ModelConfig):
    """The transformers config of model.path / model.preset with model.rope_scaling applied
    as training applies it (models/rope.py), or None for a factory."""
    found = _source_config(model)
    if found is None:
        return None
    name = f"model.preset={model.preset}" if model.preset else f"model.path={model.path}"
    return with_rope_scaling(found, model.rope_scaling, name)


def _source_config(model: ModelConfig):
    """The transformers config model.path / model.preset names, as it is there; None
    (transformers not imported) for a plain nn.Module: a factory's or an image preset."""
    if model.preset in IMAGE_PRESETS or model.preset in CLASSIFIER_PRESETS:
        return None  # a plain nn.Module preset, built like a factory model
    if model.preset:
        if model.preset == DEMO_BASE:
            from transformers import AutoConfig

            from memfit.demo import demo_assets_dir

            return AutoConfig.from_pretrained(demo_assets_dir() / "base")
        if model.preset not in PRESETS:
            raise ModelError(f"model.preset={model.preset!r} is not one of: "
                             f"{', '.join(preset_names())}")
        return PRESETS[model.preset]()
    if model.path:
        return path_config(Path(model.path))
    return None


def depth(transformers_config) -> int | None:
    """The repeated block stack's depth; None for architectures without one
    num_hidden_layers (ResNet's stages), which are planned whole."""
    layers = getattr(transformers_config, "num_hidden_layers", None)
    return None if layers is None else int(layers)


@dataclass(frozen=True)
class BuildInputs:
    """Everything ``build`` reads of a run, and nothing else: the one list of it (the
    planner's trace cache is keyed on it, plan/trace_inputs.py)."""

    # The model (a classifier's classes resolved from data.path, as training resolves
    # them), adapter, precision and memory sections; the strategy is none: it places the
    # model and wraps its optimizer after the stages built here
    # (training.build.place_and_optimize), so every strategy shares one built model.
    techniques: registry.TechniqueOptions
    images: ImagesConfig  # data.images: an image preset's input
    device: str  # cuda, cpu: the bitsandbytes code path a quantized base would take
    # model.factory's file, (modification time, size): an edited factory builds anew
    factory_version: tuple[int, int] | tuple[()]

    @classmethod
    def of(cls, config: Config, device: str) -> BuildInputs:
        model = config.model
        if model.task in CLASSIFYING_TASKS and config.data.path is not None:
            model = _classified(model, config.data, config.train.seed)
        techniques = replace(registry.TechniqueOptions.of(config), model=model,
                             strategy=DistributedStrategy.NONE)
        version = _file_version(model.factory) if model.factory else ()
        return cls(techniques, config.data.images, device, version)


# A classifier's classes (models.classifier.classified reads every row): once per data
# and model section, not once per strategy planned.
_classified = functools.lru_cache(maxsize=8)(classified)


def build(inputs: BuildInputs, layers: int | None = None) -> MetaModel:
    """The model as training would build it, on meta; ``layers`` shortens an HF model."""
    options = inputs.techniques
    base_config = hf_config(options.model)
    if base_config is None and (options.model.preset in IMAGE_PRESETS
                                or options.model.preset in CLASSIFIER_PRESETS):
        with torch.device("meta"):
            model = build_image_preset(options.model, inputs.images)
        is_transformers, depth_used = False, None
    elif base_config is None:
        model, is_transformers, depth_used = _from_factory(options.model.factory), False, None
    else:
        base_config = _with_layers(base_config, layers)
        if options.model.task in CLASSIFYING_TASKS:
            base_config = _with_classes(base_config, options.model)
        model, is_transformers = _from_hf_config(base_config, options.model.task), True
        depth_used = depth(base_config)
    model.to(registry.planned_weights_dtype(options))
    model = registry.plan_apply(model, registry.setting(model, options, is_transformers,
                                                        inputs.device))
    _as_peft_quantized_layers(model)
    return MetaModel(model, is_transformers, depth_used)


def _as_peft_quantized_layers(model: nn.Module) -> None:
    """Give each LoRA wrapper around a quantized stand-in the forward of the PEFT class
    that wraps the bitsandbytes layer in training (``peft.tuners.lora.bnb``): PEFT
    dispatches on the base layer's type, which the stand-in is not. Their forward differs
    from a plain Linear's: the 4-bit one clones the base output ("defensively", as PEFT
    says), and both cast the adapter's input to the adapters' dtype and its output to the
    base output's dtype when ``torch.is_autocast_enabled()`` (CUDA's flag) is off, as it is
    under CPU autocast. Under bf16 autocast with an fp32 residual stream each is one more
    fp32 copy of a layer's output (a 2-layer Phi-3 planned 4.8% below the tracker without
    them). The trace runs under CPU autocast, so a CUDA plan counts the casts CUDA
    autocast skips: above the need there, not below. Both classes lay out their state as
    PEFT's ``lora.Linear``, so changing the class is enough."""
    wrapped = [module for module in model.modules()
               if isinstance(getattr(module, "base_layer", None), QuantizedLinear)]
    if not wrapped:  # importing PEFT's bitsandbytes module imports bitsandbytes: only if needed
        return
    try:
        from peft.tuners.lora import bnb as peft_bnb
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:  # no bitsandbytes: training could not quantize the base either
        return
    for module in wrapped:
        if type(module) is LoraLinear:
            name = "Linear4bit" if module.base_layer.path == "matmul4bit" else "Linear8bitLt"
            wrapper = getattr(peft_bnb, name, None)
            if wrapper is not None:
                module.__class__ = wrapper


def _with_layers(transformers_config, layers: int | None):
    if layers is None:
        return transformers_config
    shorter = copy.deepcopy(transformers_config)
    shorter.num_hidden_layers = layers
    if getattr(shorter, "layer_types", None):  # per-layer attention kinds (Gemma-2, Qwen2)
        shorter.layer_types = list(shorter.layer_types)[:layers]
    return shorter


def _with_classes(transformers_config, model: ModelConfig):
    """The transformers config of a sequence classifier with the classes it will train."""
    labels = model.labels or tuple(
        f"LABEL_{index}" for index in range(model.num_labels or transformers_config.num_labels))
    shaped = copy.deepcopy(transformers_config)
    for key, value in label_arguments(labels).items():
        setattr(shaped, key, value)
    if getattr(shaped, "pad_token_id", 0) is None:  # decoder classifiers need one
        shaped.pad_token_id = 0
    return shaped


def _from_hf_config(transformers_config, task: Task) -> nn.Module:
    import transformers

    classes = {Task.CAUSAL_LM: transformers.AutoModelForCausalLM,
               Task.SEQUENCE_CLASSIFICATION: transformers.AutoModelForSequenceClassification,
               Task.IMAGE_CLASSIFICATION: transformers.AutoModelForImageClassification}
    if task not in classes:
        raise ModelError(f"model.task={task} needs model.factory")
    with torch.device("meta"):
        return classes[task].from_config(transformers_config)


# (model.factory, its file's modification time and size) -> the module it built on meta
_FACTORY_MODELS: dict[tuple, nn.Module] = {}


def _from_factory(reference: str) -> nn.Module:
    """A copy of what ``model.factory`` (``reference``) builds on meta; the factory runs once
    per version of its file (a plan calls this for every strategy; the techniques change
    the copy)."""
    key = (reference, *_file_version(reference))
    if key not in _FACTORY_MODELS:
        _FACTORY_MODELS[key] = _run_factory(reference)
    try:
        return copy.deepcopy(_FACTORY_MODELS[key])
    except Exception:  # noqa: BLE001  (something in the module that cannot be copied)
        return _run_factory(reference)


def _file_version(reference: str) -> tuple[int, int] | tuple[()]:
    """A factory file's (modification time, size): an edited file is built again."""
    module, _, _ = reference.rpartition(":")
    if not module.endswith(".py"):
        return ()  # an imported module: Python keeps its first import too
    try:
        status = Path(module).stat()
    except OSError:
        return ()  # import_object says what is wrong with it
    return status.st_mtime_ns, status.st_size


def _run_factory(reference: str) -> nn.Module:
    factory = import_object(reference, "model.factory")
    try:
        with torch.device("meta"), from_pretrained_on_meta(), warnings.catch_warnings():
            # A load_state_dict into the meta model is the no-op planning wants: torch warns
            # once per parameter that copying into a meta tensor does nothing.
            warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter")
            model = factory()
    except Exception as error:  # noqa: BLE001  (the user's code failed; say where)
        raise ModelError(f"model.factory={reference!r} raised {error!r} while being built "
                         "on the meta device") from None
    if not isinstance(model, nn.Module):
        raise ModelError(f"model.factory={reference!r} returned {type(model).__name__}, not "
                         "an nn.Module")
    return model
