"""Cross-key rules, checked before anything is built.

Each rule raises a ConfigError naming the keys involved and what would be valid. The rules
that ask an optimizer's or a strategy's spec live with the specs
(memfit.techniques.config_checks), which run these first.
"""

from __future__ import annotations

import math

from memfit._utils.errors import ConfigError
from memfit._utils.sizes import parse_bytes
from memfit.config.choices import TOKEN_FORMATS, RopeScaling
from memfit.config.limits import (
    MAX_CLASSES,
    MAX_EPOCHS,
    check_bytes,
    check_control_characters,
    check_count,
    check_int_limits,
)
from memfit.config.schema import (
    AdapterKind,
    Config,
    DataFormat,
    DistributedStrategy,
    ModelDtype,
    NonfiniteAction,
    Precision,
    Task,
)
from memfit.config.sequence_parallel import check_sequence_parallel


def validate(config: Config) -> None:
    check_control_characters(config)
    _check_model(config)
    check_numbers(config)
    check_rope_scaling(config)
    _check_combinations(config)
    _check_distributed(config)
    _check_nonfinite(config)
    _check_classification(config)


def _check_model(config: Config) -> None:
    model = config.model
    sources = {"model.path": model.path, "model.preset": model.preset,
               "model.factory": model.factory}
    given = [key for key, value in sources.items() if value]
    if len(given) != 1:
        found = f"got {', '.join(given)}" if given else "got none"
        raise ConfigError(f"set exactly one of model.path, model.preset, model.factory ({found})")
    if model.loss and not model.factory:
        raise ConfigError("model.loss applies only to model.factory models")
    if model.export_module is not None and not model.factory:
        raise ConfigError(f"model.export_module={model.export_module!r} applies only to "
                          "model.factory models; model.path and model.preset models are "
                          "exported whole as Hugging Face folders already")
    for key in ("factory", "loss"):
        value = getattr(model, key)
        if value and ":" not in value:
            raise ConfigError(f"model.{key}={value!r} must look like 'package.module:function'")
    if config.data.path is None:
        raise ConfigError("data.path is not set: name a data file or folder")


def check_numbers(config: Config) -> None:
    """Every number within its range (what a plan needs too: memfit plan checks these)."""
    check_int_limits(config)
    for key, value, (inside, valid) in _float_domains(config):
        # Written as "not inside": nan compares false both ways, so `value < 0` lets it pass.
        if not (math.isfinite(value) and inside(value)):
            raise ConfigError(f"{key} must be {valid}, got {value}")
    check_count("train.epochs", config.train.epochs, 0, MAX_EPOCHS)
    for key in ("checkpoint_blocks", "offload_blocks"):
        _check_share_of_blocks(f"memory.{key}", getattr(config.memory, key))
    betas = config.optimizer.betas
    if betas is not None and not all(math.isfinite(beta) and 0 <= beta < 1 for beta in betas):
        raise ConfigError(
            f"optimizer.betas must be two numbers each in [0, 1), got [{betas[0]}, {betas[1]}]")
    if config.memory.budget is not None:
        try:
            budget = parse_bytes(config.memory.budget)
        except ValueError as error:
            raise ConfigError(f"memory.budget: {error}") from None
        check_bytes("memory.budget", budget, config.memory.budget)


def _check_share_of_blocks(key: str, value: int | float | None) -> None:
    """A float is a share of the blocks, in (0, 1]; a count (>= 0) is a whole number, and
    whether it is within the model's depth is known once the model is (techniques/blocks.py)."""
    if isinstance(value, float) and not (math.isfinite(value) and 0 < value <= 1):
        raise ConfigError(f"{key}={value} as a fraction of the blocks must be in (0, 1]; a "
                          f"count of blocks is a whole number ({key}=4)")


_ABOVE_ZERO = (lambda value: value > 0, "above 0 and finite")
_ZERO_OR_MORE = (lambda value: value >= 0, "0 or more and finite")
_FRACTION = (lambda value: 0 <= value < 1, "in [0, 1)")


def _float_domains(config: Config):
    """Every float key of schema.py with its valid range: (key, value, (test, words))."""
    domains = [
        ("optimizer.lr", config.optimizer.lr, _ABOVE_ZERO),
        ("optimizer.weight_decay", config.optimizer.weight_decay, _ZERO_OR_MORE),
        ("optimizer.galore.scale", config.optimizer.galore.scale, _ABOVE_ZERO),
        ("adapter.alpha", config.adapter.alpha, _ABOVE_ZERO),
        ("adapter.dropout", config.adapter.dropout, _FRACTION),
        ("data.eval_fraction", config.data.eval_fraction, _FRACTION),
        ("train.epochs", config.train.epochs, _ABOVE_ZERO),
    ]
    rope = config.model.rope_scaling
    if rope.factor is not None:
        domains.append(("model.rope_scaling.factor", rope.factor,
                        (lambda value: value > 1, "above 1 (the native window times it)")))
    if rope.type is RopeScaling.LLAMA3:
        domains += [("model.rope_scaling.low_freq_factor", rope.low_freq_factor, _ABOVE_ZERO),
                    ("model.rope_scaling.high_freq_factor", rope.high_freq_factor, _ABOVE_ZERO)]
    if config.optimizer.eps is not None:
        domains.append(("optimizer.eps", config.optimizer.eps, _ABOVE_ZERO))
    if config.train.max_grad_norm is not None:
        domains.append(("train.max_grad_norm", config.train.max_grad_norm,
                        (_ABOVE_ZERO[0], "above 0 and finite, or null to disable clipping")))
    return domains


def check_rope_scaling(config: Config) -> None:
    """model.rope_scaling as a whole: a method and its factor together, on a model that can
    have rotary embeddings (whether it does is known once its config is read:
    models/rope.py)."""
    rope, model = config.model.rope_scaling, config.model
    methods = ", ".join(str(member) for member in RopeScaling if member is not RopeScaling.NONE)
    if rope.type is RopeScaling.NONE:
        if rope.factor is not None:
            raise ConfigError(f"model.rope_scaling.factor={rope.factor} needs "
                              f"model.rope_scaling.type, one of: {methods}")
        return
    if rope.factor is None:
        raise ConfigError(f"model.rope_scaling.type={rope.type} needs model.rope_scaling.factor "
                          "(how many times the native window, a number above 1, e.g. 4)")
    if model.factory or model.task not in (Task.CAUSAL_LM, Task.SEQUENCE_CLASSIFICATION):
        source = "model.factory" if model.factory else f"model.task={model.task}"
        raise ConfigError(f"model.rope_scaling.type={rope.type} applies to causal-lm and "
                          "sequence-classification models of model.path or model.preset with "
                          f"rotary position embeddings, not {source}; set "
                          "model.rope_scaling.type=none")
    if rope.type is RopeScaling.LLAMA3 and rope.high_freq_factor <= rope.low_freq_factor:
        raise ConfigError(f"model.rope_scaling.high_freq_factor={rope.high_freq_factor} must be "
                          f"above model.rope_scaling.low_freq_factor={rope.low_freq_factor}")


def _check_combinations(config: Config) -> None:
    task, data_format = config.model.task, config.data.format
    if task is Task.CAUSAL_LM and data_format not in TOKEN_FORMATS:
        raise ConfigError(
            f"model.task=causal-lm needs data.format text, instruction or chat, not {data_format}"
        )
    if config.data.sample_prompts and task is not Task.CAUSAL_LM:
        raise ConfigError(f"data.sample_prompts needs model.task=causal-lm, not {task}")
    if task is Task.CUSTOM and not config.model.factory:
        raise ConfigError("model.task=custom needs model.factory")
    if (config.data.pack and config.model.factory
            and data_format in (DataFormat.INSTRUCTION, DataFormat.CHAT)):
        raise ConfigError(f"data.pack=true with data.format={data_format} needs a transformers "
                          "model (model.path or model.preset): packed rows are kept apart by "
                          "position ids, which a model.factory module does not read; set "
                          "data.pack=false")
    if task is Task.AUTOENCODER and data_format is not DataFormat.IMAGES:
        raise ConfigError(f"model.task=autoencoder needs data.format=images, not {data_format}")
    if task is Task.IMAGE_CLASSIFICATION and data_format is not DataFormat.IMAGES:
        raise ConfigError("model.task=image-classification needs data.format=images (class "
                          f"folders or a .npz of images and labels), not {data_format}")
    if data_format is DataFormat.IMAGES and task not in (Task.AUTOENCODER, Task.CUSTOM,
                                                         Task.IMAGE_CLASSIFICATION):
        raise ConfigError("data.format=images needs model.task autoencoder, "
                          f"image-classification or custom, not {task}")
    if task is Task.IMAGE_CLASSIFICATION and config.model.loss:
        raise ConfigError("model.task=image-classification trains with cross-entropy on the "
                          "model's logits; model.loss applies to model.task=custom")
    if task is Task.AUTOENCODER and (config.model.path or config.model.loss):
        raise ConfigError("model.task=autoencoder takes model.preset (conv-autoencoder, "
                          "vit-autoencoder) or model.factory, and its loss from "
                          "model.reconstruction_loss (not model.path / model.loss)")
    if config.memory.optimizer_offload and config.optimizer.layerwise:
        raise ConfigError("memory.optimizer_offload=true cannot be combined with "
                          "optimizer.layerwise=true (layer-wise updates step inside backward)")
    if config.memory.chunked_loss and task is not Task.CAUSAL_LM:
        raise ConfigError(f"memory.chunked_loss=true needs model.task=causal-lm, not {task}")
    if config.memory.checkpoint_modules and not (config.model.factory
                                                 or task is Task.AUTOENCODER
                                                 or (task is Task.IMAGE_CLASSIFICATION
                                                     and config.model.preset)):
        raise ConfigError("memory.checkpoint_modules applies to model.factory models; "
                          "Hugging Face models checkpoint their own decoder layers")
    if config.optimizer.layerwise and config.precision is Precision.FP16:
        raise ConfigError(
            "optimizer.layerwise=true cannot use precision=fp16: its gradient scaler must see "
            "every gradient before any step, and layer-wise steps run inside backward; use "
            "bf16 or fp32"
        )
    if config.model.dtype is ModelDtype.FLOAT16 and config.precision is Precision.BF16_PURE:
        raise ConfigError("model.dtype=float16 contradicts precision=bf16-pure, which trains "
                          "bfloat16 weights; drop model.dtype or use precision=fp16")
    if (config.model.dtype is ModelDtype.FLOAT16 and config.precision is Precision.FP16
            and config.adapter.kind is AdapterKind.NONE):
        raise ConfigError(
            "model.dtype=float16 with precision=fp16 and adapter.kind=none trains float16 "
            "weights, whose gradients the fp16 gradient scaler refuses to unscale; keep "
            "model.dtype=float32 (autocast computes in float16) or train adapters")
    every = config.log.memory_every
    if isinstance(every, str) and every != "auto":
        raise ConfigError(f"log.memory_every must be auto or a whole number N (measure every "
                          f"N-th step), got {every!r}")
    if config.memory.budget is not None and every not in (1, "auto"):
        raise ConfigError("memory.budget needs log.memory_every=1 or auto (every step is "
                          "checked)")
    if config.memory.auto and config.memory.budget is None:
        raise ConfigError("memory.auto=true needs memory.budget (e.g. memory.budget=24GiB)")


def _check_distributed(config: Config) -> None:
    strategy, nproc = config.distributed.strategy, config.distributed.nproc
    if strategy is DistributedStrategy.NONE and nproc > 1:
        raise ConfigError(f"distributed.nproc={nproc} needs distributed.strategy=ddp "
                          "(every process holds the whole model) or fsdp (sharded)")
    check_sequence_parallel(config)


def _check_nonfinite(config: Config) -> None:
    train = config.train
    if train.on_nonfinite is NonfiniteAction.SKIP and config.optimizer.layerwise:
        raise ConfigError(
            "train.on_nonfinite=skip cannot be combined with optimizer.layerwise=true: "
            "layer-wise updates are applied inside backward, before the step's loss is known, "
            "so they cannot be dropped; use train.on_nonfinite=stop or optimizer.layerwise=false")


def _check_classification(config: Config) -> None:
    model, data_format = config.model, config.data.format
    classifies = model.task is Task.SEQUENCE_CLASSIFICATION
    if classifies != (data_format is DataFormat.CLASSIFICATION):
        raise ConfigError(
            f"model.task={model.task} with data.format={data_format}: "
            "model.task=sequence-classification and data.format=classification go together")
    if not (classifies or model.task is Task.IMAGE_CLASSIFICATION):
        return
    if classifies and not model.path:
        source = "model.preset" if model.preset else "model.factory"
        raise ConfigError(
            f"model.task=sequence-classification loads a Hugging Face folder: set model.path "
            f"instead of {source} (presets are causal language models; a factory module "
            "trains with model.task=custom)")
    if not model.labels:
        return
    if len(model.labels) > MAX_CLASSES:
        raise ConfigError(f"model.labels names {len(model.labels):,} classes, beyond memfit's "
                          f"limit of {MAX_CLASSES:,}")
    if len(set(model.labels)) != len(model.labels) or len(model.labels) < 2 \
            or not all(model.labels):
        # Cut at 200 characters: model.labels may name up to MAX_CLASSES classes.
        raise ConfigError(f"model.labels={list(model.labels)!s:.200} must name at least 2 "
                          "classes, each once and non-empty")
    if model.num_labels is not None and model.num_labels != len(model.labels):
        raise ConfigError(f"model.labels names {len(model.labels)} classes but model.num_labels="
                          f"{model.num_labels}; give one name per class, or drop one of the two")
