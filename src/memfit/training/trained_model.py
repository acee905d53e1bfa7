"""A finished run's trained model, rebuilt from its folder: what ``memfit merge`` writes
out and ``memfit generate`` / ``memfit predict`` answer with.

- An adapter run: the base rebuilt exactly as training saw it (same seed for built
  models, same quantization, same storage dtype), quantized layers dequantized to
  ``model.dtype`` — so the merged weights are ``dequant(W_q) + (alpha / r) B A``, the
  function the adapter model computed, not the original W plus an update trained against
  a different base — and PEFT's ``merge_and_unload`` folding the update in and removing
  every LoRA module. The base's buffers are then set to the values training left them at
  (``adapter/buffers.safetensors``: BatchNorm running statistics move even in frozen
  layers).
- A full fine-tune trained with distributed.strategy=fsdp: its newest sharded checkpoint
  consolidated into one model (finished or not).
- Any other full fine-tune (``trained_model`` only): its ``model/`` folder, a Hugging Face
  folder loaded as ``model.path`` is, or a factory module's state dict loaded with
  ``load_state_dict(strict=True)``.

A run folder may come from anyone: what cannot be rebuilt faithfully is refused in one
line (checkpoint/adapter_checks.py: non-finite, unmatched, missing or misshapen adapter
tensors, q,k,v parts (``adapter/parts.json``) outside their module's rows, LoRA settings
memfit does not write, damaged files; a file of the result that links out of the run).
The caller checks the run's config for code to import (config/code_trust.py) before.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from memfit._utils.errors import ConfigError
from memfit.checkpoint import adapter_checks, newest_intact_checkpoint
from memfit.checkpoint.export import BUFFERS_FILE, PARTS_FILE, load_trained_buffers
from memfit.checkpoint.sharded import is_sharded_checkpoint, load_trainable
from memfit.checkpoint.state import buffer_state
from memfit.config import Config
from memfit.config.load import read_yaml
from memfit.config.schema import AdapterKind, Precision
from memfit.models.export_module import exported_module
from memfit.models.load import TORCH_DTYPES, load_model
from memfit.techniques import quantize
from memfit.techniques.config_checks import from_mapping
from memfit.techniques.lora_parts import fused_width
from memfit.techniques.registry import TechniqueOptions, frozen_storage_dtype
from memfit.training.build import load_base, seed_everything
from memfit.training.run_folder import MARKER_FILE, is_run_folder

# (model, tokenizer or None, is_transformers): what every loader here returns.
Trained = tuple[nn.Module, object | None, bool]


def run_config(run_dir: Path, command: str = "memfit merge") -> Config:
    """The configuration the run in ``run_dir`` trained with; ``command`` (e.g. "memfit
    generate") begins each refusal."""
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise ConfigError(f"{command} {run_dir}: no config.yaml there (not a run folder)")
    if not is_run_folder(run_dir):  # another tool's folder that happens to hold a config.yaml
        raise ConfigError(f"{command} {run_dir}: not a memfit run folder (no {MARKER_FILE} "
                          "there)")
    return from_mapping(read_yaml(config_path))


def trained_model(run_dir: Path, config: Config, command: str) -> Trained:
    """The run's result, whatever it trained: adapters merged in (``merged_model``), a
    sharded full fine-tune consolidated, or the ``model/`` folder a full fine-tune wrote."""
    checkpoint = newest_intact_checkpoint(run_dir)
    if config.adapter.kind is not AdapterKind.NONE or (
            checkpoint is not None and is_sharded_checkpoint(checkpoint)):
        return merged_model(run_dir, config, command)
    return _full_model(run_dir, config, command)


def merged_model(run_dir: Path, config: Config, command: str = "memfit merge") -> Trained:
    """(merged model, tokenizer or None, is_transformers) for the run in ``run_dir``, whose
    ``config`` the caller has read (and checked for code to trust)."""
    adapter_dir = run_dir / "adapter"
    checkpoint = newest_intact_checkpoint(run_dir)
    if (config.adapter.kind is AdapterKind.NONE and checkpoint is not None
            and is_sharded_checkpoint(checkpoint)):
        return _consolidated(config, checkpoint)
    if config.adapter.kind is AdapterKind.NONE:
        raise ConfigError(f"{command} {run_dir}: the run trained without adapters "
                          "(adapter.kind=none); its model/ folder is already the full model")
    if not (adapter_dir / adapter_checks.CONFIG_FILE).is_file():
        raise ConfigError(f"{command} {run_dir}: no adapter/adapter_config.json (the run "
                          "has not finished; train it to the end first)")
    if not (adapter_dir / adapter_checks.WEIGHTS_FILE).is_file():
        # PEFT would fall back to a pickled adapter_model.bin: memfit never unpickles.
        raise ConfigError(f"{command} {run_dir}: no adapter/adapter_model.safetensors "
                          "(memfit writes adapters only as safetensors)")
    adapter = adapter_checks.read_adapter(run_dir, adapter_dir)  # before the (slow) base
    seed_everything(config.train.seed)  # built models get the weights training started from
    loaded = load_base(config)
    base, dtype = loaded.model, TORCH_DTYPES[config.model.dtype]
    base.requires_grad_(False)
    storage_dtype = frozen_storage_dtype(TechniqueOptions.of(config))
    if storage_dtype is not None:
        # Training stored frozen Linear weights in the compute dtype: merge onto exactly
        # those values (cast back to model.dtype below).
        quantize.store_frozen_in(base, storage_dtype)
    quantize.dequantize(base, dtype)
    target = exported_module(base, config.model.export_module)
    quantizer = getattr(target, "hf_quantizer", None)
    if quantizer is not None:  # a normal folder again: no quantization_config in config.json
        # (and transformers refuses to cast a model it still takes for a bitsandbytes one)
        quantizer.remove_quantization_config(target)
    base.to(dtype)
    adapter_checks.check_targets(adapter_dir / adapter_checks.CONFIG_FILE,
                                 adapter.settings["target_modules"],
                                 [name for name, _ in target.named_modules() if name])
    merged = _merged_adapter(target, adapter, adapter_dir)
    load_trained_buffers(adapter_dir, merged)  # refuses names and shapes the model lacks
    if adapter.buffers is not None:  # and their dtypes: an integer counter is no statistic
        adapter_checks.check_tensors_fit(adapter_dir / BUFFERS_FILE, adapter.buffers,
                                         buffer_state(merged), "the merged model's buffers",
                                         complete=False)
    _check_finite(run_dir, merged, command)
    is_transformers = loaded.is_transformers or config.model.export_module is not None
    return merged, loaded.tokenizer, is_transformers


def _merged_adapter(target: nn.Module, adapter: adapter_checks.Adapter,
                    adapter_dir: Path) -> nn.Module:
    """``target`` with ``adapter`` (read from ``adapter_dir``) folded in. What
    ``PeftModel.from_pretrained`` does, split so that the saved tensors are compared with
    the ones the wrapped model calls for before any is loaded: PEFT drops a key that
    matches no module with a warning and keeps a missing one at its initial value."""
    from peft import LoraConfig, PeftModel, get_peft_model_state_dict, set_peft_model_state_dict
    from peft.auto import MODEL_TYPE_TO_PEFT_MODEL_MAPPING

    from memfit.techniques import lora_layers

    config_file = adapter_dir / adapter_checks.CONFIG_FILE
    weights_file = adapter_dir / adapter_checks.WEIGHTS_FILE
    modules = dict(target.named_modules())
    adapter_checks.check_parts_fit(adapter_dir / PARTS_FILE, adapter.parts,
                                   {name: fused_width(modules[name]) if name in modules else None
                                    for name in adapter.parts})
    try:
        lora = LoraConfig(**{**adapter.settings, "inference_mode": True})
        # memfit's layers where it trained with them: Conv subclasses, q,k,v parts
        lora_layers.register(lora, {id(modules[name]): rows
                                    for name, rows in adapter.parts.items()})
        wrapper = MODEL_TYPE_TO_PEFT_MODEL_MAPPING.get(lora.task_type, PeftModel)
        model = wrapper(target, lora)
    except (ValueError, TypeError) as error:  # PEFT's word on a setting or a module type
        reason = " ".join(str(error).split())
        raise ConfigError(f"{config_file}: PEFT cannot apply it to the base: {reason}") from None
    # PEFT saves embedding layers too when they are targeted or were resized ("auto",
    # which asks the Hub about base_model_name_or_path): accepted, never required, and no
    # network lookup.
    needed = get_peft_model_state_dict(model, save_embedding_layers=False)
    try:
        optional = get_peft_model_state_dict(model, save_embedding_layers=True)
    except NotImplementedError:  # a model without input embeddings (ResNet): none to save
        optional = needed
    adapter_checks.check_tensors_fit(
        weights_file, adapter.weights, needed, f"the adapter {config_file.name} describes on "
        "this base", optional=optional)
    set_peft_model_state_dict(model, adapter.weights)
    return model.merge_and_unload()


def _check_finite(run_dir: Path, model: nn.Module, command: str) -> None:
    """The last line of defence before writing: a finite adapter can still overflow
    model.dtype once added to the base (and the base itself may hold nan)."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise ConfigError(f"{command} {run_dir}: the merged {name} holds nan or inf "
                              "values (does the update overflow model.dtype?)")


def _consolidated(config: Config, checkpoint: Path) -> Trained:
    """A full fine-tune's newest sharded (distributed.strategy=fsdp) checkpoint as one
    model: the base rebuilt as training started, every weight read back whole."""
    seed_everything(config.train.seed)
    loaded = load_base(config)
    if config.precision is Precision.BF16_PURE:
        loaded.model.to(torch.bfloat16)  # the dtype the weights trained (and were saved) in
    load_trainable(checkpoint, loaded.model)
    name = config.model.export_module
    return (exported_module(loaded.model, name), loaded.tokenizer,
            loaded.is_transformers or name is not None)


def _full_model(run_dir: Path, config: Config, command: str) -> Trained:
    """A full fine-tune's ``model/``: a Hugging Face folder (loaded with the Auto class of
    model.task, as a model.path is), or a factory module's state dict."""
    model_dir = run_dir / "model"
    if not model_dir.is_dir():
        raise ConfigError(f"{command} {run_dir}: no model/ folder (the run has not finished; "
                          "train it to the end first)")
    adapter_checks.check_inside(run_dir, [model_dir, *model_dir.iterdir()])
    dtype = TORCH_DTYPES[config.model.dtype]
    weights = model_dir / "model.safetensors"
    if (model_dir / "config.json").is_file():
        folder = replace(config.model, path=str(model_dir), preset=None, factory=None)
        loaded = load_model(folder, images=config.data.images)
        return loaded.model.to(dtype), loaded.tokenizer, True
    if not weights.is_file():
        raise ConfigError(f"{command} {run_dir}: model/ holds neither config.json nor "
                          "model.safetensors (not a model memfit exported)")
    seed_everything(config.train.seed)
    loaded = load_model(config.model, images=config.data.images)
    try:
        loaded.model.load_state_dict(adapter_checks.read_tensors(weights, floating_only=False),
                                     strict=True)
    except RuntimeError as error:
        reason = " ".join(str(error).split())[:300]
        raise ConfigError(f"{weights} does not load into model.factory's module "
                          f"({reason})") from None
    return loaded.model, loaded.tokenizer, False
