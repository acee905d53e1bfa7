"""``memfit merge RUN_DIR --out DIR``: the trained adapters folded into the base weights.

The base is rebuilt exactly as training saw it (same seed for built models, same
quantization, same storage dtype), quantized layers are dequantized to ``model.dtype`` —
so the merged weights are ``dequant(W_q) + (alpha / r) B A``, the function the adapter
model computed, not the original W plus an update trained against a different base — and
PEFT's ``merge_and_unload`` folds the update in and removes every LoRA module.

The base's buffers are then set to the values training left them at
(``adapter/buffers.safetensors``: BatchNorm running statistics move even in frozen layers).

Output: a normal Hugging Face folder (config + model.safetensors + tokenizer) for
transformers models and for a factory's ``model.export_module`` (the adapter was saved
relative to that submodule, and is merged into it alone), or ``model.safetensors``
holding a state dict (parameters and persistent buffers) that loads into the factory's
module with ``load_state_dict(strict=True)``.

A full fine-tune trained with distributed.strategy=fsdp is consolidated instead: its
newest sharded checkpoint becomes one normal model folder (finished or not).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from memfit._utils.atomic import staged_folder
from memfit._utils.errors import ConfigError
from memfit._utils.folders import creation_problem
from memfit.checkpoint import newest_intact_checkpoint
from memfit.checkpoint.export import load_trained_buffers, save_model
from memfit.config import Config, from_mapping
from memfit.config.code_trust import refuse_untrusted_code
from memfit.config.load import read_yaml
from memfit.config.schema import AdapterKind, Precision
from memfit.distributed.checkpoint import is_sharded_checkpoint, load_trainable
from memfit.models.export_module import exported_module
from memfit.models.load import TORCH_DTYPES
from memfit.techniques import quantize
from memfit.techniques.registry import frozen_storage_dtype
from memfit.training.build import load_base, seed_everything


def merged_model(run_dir: Path, trust_code: bool = False
                 ) -> tuple[nn.Module, object | None, bool]:
    """(merged model, tokenizer or None, is_transformers) for the run in ``run_dir``;
    ``trust_code``: import the code its config names (``--trust-code``)."""
    from peft import PeftModel

    config_path, adapter_dir = run_dir / "config.yaml", run_dir / "adapter"
    if not config_path.is_file():
        raise ConfigError(f"memfit merge {run_dir}: no config.yaml there (not a run folder)")
    config = from_mapping(read_yaml(config_path))
    refuse_untrusted_code(config, f"memfit merge {run_dir}: its config.yaml", trust_code)
    checkpoint = newest_intact_checkpoint(run_dir)
    if (config.adapter.kind is AdapterKind.NONE and checkpoint is not None
            and is_sharded_checkpoint(checkpoint)):
        return _consolidated(config, checkpoint)
    if config.adapter.kind is AdapterKind.NONE:
        raise ConfigError(f"memfit merge {run_dir}: the run trained without adapters "
                          "(adapter.kind=none); its model/ folder is already the full model")
    if not (adapter_dir / "adapter_config.json").is_file():
        raise ConfigError(f"memfit merge {run_dir}: no adapter/adapter_config.json (the run "
                          "has not finished; train it to the end first)")
    if not (adapter_dir / "adapter_model.safetensors").is_file():
        # PEFT would fall back to a pickled adapter_model.bin: memfit never unpickles.
        raise ConfigError(f"memfit merge {run_dir}: no adapter/adapter_model.safetensors "
                          "(memfit writes adapters only as safetensors)")
    seed_everything(config.train.seed)  # built models get the weights training started from
    loaded = load_base(config)
    base, dtype = loaded.model, TORCH_DTYPES[config.model.dtype]
    base.requires_grad_(False)
    storage_dtype = frozen_storage_dtype(config)
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
    merged = PeftModel.from_pretrained(target, adapter_dir).merge_and_unload()
    load_trained_buffers(adapter_dir, merged)
    is_transformers = loaded.is_transformers or config.model.export_module is not None
    return merged, loaded.tokenizer, is_transformers


def _consolidated(config: Config, checkpoint: Path) -> tuple[nn.Module, object | None, bool]:
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


def _check_out(run_dir: Path, out: Path, force: bool) -> None:
    """Refuse an ``--out`` that would overwrite or sit inside what the user has: the run
    itself, the current directory, or a folder with content (unless ``--force``)."""
    run, target, here = run_dir.resolve(), out.resolve(), Path.cwd().resolve()
    for name, place in (("the run folder", run), ("the current directory", here)):
        if target == place or place.is_relative_to(target):
            raise ConfigError(f"memfit merge --out {out}: that is or contains {name}; "
                              "choose a new folder")
    if target.is_relative_to(run):
        raise ConfigError(f"memfit merge --out {out}: that is inside the run folder {run_dir}; "
                          "choose a folder outside it")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"memfit merge --out {out}: that is a file; choose a new folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ConfigError(f"memfit merge --out {out}: that folder is not empty; choose a new "
                          "folder, or pass --force to replace its contents")
    problem = None if out.is_dir() else creation_problem(out)
    if problem is not None:
        raise ConfigError(f"memfit merge --out {out} cannot be created: {problem}")


def merge_run(run_dir: str | Path, out: str | Path, force: bool = False,
              trust_code: bool = False) -> Path:
    """Write the merged model of ``run_dir`` to ``out``: a new or empty folder, or with
    ``force`` a folder whose contents are replaced — only once the new model is complete
    (written beside it, then swapped in)."""
    run_dir, out = Path(run_dir), Path(out)
    _check_out(run_dir, out, force)
    model, tokenizer, is_transformers = merged_model(run_dir, trust_code)
    with staged_folder(out) as folder:
        save_model(folder, model, tokenizer, save_pretrained=is_transformers)
    return out
