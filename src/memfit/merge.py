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

A run folder may come from anyone: what merge cannot fold in faithfully is refused in one
line before anything is written (checkpoint/adapter_checks.py: non-finite, unmatched,
missing or misshapen adapter tensors, q,k,v parts (``adapter/parts.json``) outside their
module's rows, LoRA settings memfit does not write, damaged files),
and so is an ``--out`` that is a link, or is, holds or lies inside what the run reads
(its model.path, data, code) — replacing those would make a later ``--resume`` train on
the merged weights. Two merges into one ``--out`` at once: one writes, the other is
refused (``_claimed``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from memfit._utils.atomic import staged_folder
from memfit._utils.errors import ConfigError
from memfit._utils.folders import creation_problem
from memfit._utils.no_follow import link_message, open_no_follow
from memfit.checkpoint import adapter_checks, newest_intact_checkpoint
from memfit.checkpoint.export import BUFFERS_FILE, PARTS_FILE, load_trained_buffers, save_model
from memfit.checkpoint.sharded import is_sharded_checkpoint, load_trainable
from memfit.checkpoint.state import buffer_state
from memfit.config import Config, from_mapping
from memfit.config.code_trust import code_references, module_file, refuse_untrusted_code
from memfit.config.load import read_yaml
from memfit.config.schema import AdapterKind, Precision
from memfit.models.export_module import exported_module
from memfit.models.load import TORCH_DTYPES
from memfit.techniques import quantize
from memfit.techniques.lora_parts import fused_width
from memfit.techniques.registry import frozen_storage_dtype
from memfit.training.build import load_base, seed_everything
from memfit.training.run_folder import MARKER_FILE, is_run_folder


def run_config(run_dir: Path) -> Config:
    """The configuration the run in ``run_dir`` trained with."""
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise ConfigError(f"memfit merge {run_dir}: no config.yaml there (not a run folder)")
    if not is_run_folder(run_dir):  # another tool's folder that happens to hold a config.yaml
        raise ConfigError(f"memfit merge {run_dir}: not a memfit run folder (no {MARKER_FILE} "
                          "there)")
    return from_mapping(read_yaml(config_path))


def merged_model(run_dir: Path, config: Config) -> tuple[nn.Module, object | None, bool]:
    """(merged model, tokenizer or None, is_transformers) for the run in ``run_dir``, whose
    ``config`` the caller has read (and checked for code to trust)."""
    adapter_dir = run_dir / "adapter"
    checkpoint = newest_intact_checkpoint(run_dir)
    if (config.adapter.kind is AdapterKind.NONE and checkpoint is not None
            and is_sharded_checkpoint(checkpoint)):
        return _consolidated(config, checkpoint)
    if config.adapter.kind is AdapterKind.NONE:
        raise ConfigError(f"memfit merge {run_dir}: the run trained without adapters "
                          "(adapter.kind=none); its model/ folder is already the full model")
    if not (adapter_dir / adapter_checks.CONFIG_FILE).is_file():
        raise ConfigError(f"memfit merge {run_dir}: no adapter/adapter_config.json (the run "
                          "has not finished; train it to the end first)")
    if not (adapter_dir / adapter_checks.WEIGHTS_FILE).is_file():
        # PEFT would fall back to a pickled adapter_model.bin: memfit never unpickles.
        raise ConfigError(f"memfit merge {run_dir}: no adapter/adapter_model.safetensors "
                          "(memfit writes adapters only as safetensors)")
    adapter = adapter_checks.read_adapter(run_dir, adapter_dir)  # before the (slow) base
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
    adapter_checks.check_targets(adapter_dir / adapter_checks.CONFIG_FILE,
                                 adapter.settings["target_modules"],
                                 [name for name, _ in target.named_modules() if name])
    merged = _merged_adapter(target, adapter, adapter_dir)
    load_trained_buffers(adapter_dir, merged)  # refuses names and shapes the model lacks
    if adapter.buffers is not None:  # and their dtypes: an integer counter is no statistic
        adapter_checks.check_tensors_fit(adapter_dir / BUFFERS_FILE, adapter.buffers,
                                         buffer_state(merged), "the merged model's buffers",
                                         complete=False)
    _check_finite(run_dir, merged)
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
    adapter_checks.check_tensors_fit(
        weights_file, adapter.weights, needed, f"the adapter {config_file.name} describes on "
        "this base", optional=get_peft_model_state_dict(model, save_embedding_layers=True))
    set_peft_model_state_dict(model, adapter.weights)
    return model.merge_and_unload()


def _check_finite(run_dir: Path, model: nn.Module) -> None:
    """The last line of defence before writing: a finite adapter can still overflow
    model.dtype once added to the base (and the base itself may hold nan)."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise ConfigError(f"memfit merge {run_dir}: the merged {name} holds nan or inf "
                              "values (does the update overflow model.dtype?); nothing written")


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


def _places_of(config: Config) -> list[tuple[str, str]]:
    """``(key, path)`` for each file or folder the run reads when it resumes: its base, its
    data, and code files it names. A value that is no local path (a hub name) is included
    too: a folder created under that name would be read instead on the next resume."""
    places = [(key, value) for key, value in (("model.path", config.model.path),
                                              ("data.path", config.data.path),
                                              ("data.eval_path", config.data.eval_path))
              if value]
    for key, reference in code_references(config):
        found = module_file(reference.rpartition(":")[0])
        if found not in ("not found", "built in"):
            places.append((key, found))
    return places


def _check_out(run_dir: Path, config: Config, out: Path, force: bool) -> None:
    """Refuse an ``--out`` that would overwrite or sit inside what the user has: the run
    itself, what it reads (even with ``--force``: a resume would train on the merged
    weights), the current directory, a link, or a folder with content (unless
    ``--force``)."""
    if out.is_symlink():  # --force would replace the link, a plain write would follow it
        raise ConfigError(f"memfit merge --out {out}: {link_message(out)}")
    run, target, here = run_dir.resolve(), out.resolve(), Path.cwd().resolve()
    for name, place in (("the run folder", run), ("the current directory", here)):
        if target == place or place.is_relative_to(target):
            raise ConfigError(f"memfit merge --out {out}: that is or contains {name}; "
                              "choose a new folder")
    if target.is_relative_to(run):
        raise ConfigError(f"memfit merge --out {out}: that is inside the run folder {run_dir}; "
                          "choose a folder outside it")
    for key, value in _places_of(config):
        place = Path(value).resolve()
        if target == place or target.is_relative_to(place) or place.is_relative_to(target):
            raise ConfigError(f"memfit merge --out {out}: that is, holds or lies inside the "
                              f"run's {key}={value}, which a resume of the run reads (refused "
                              "even with --force); choose another folder")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"memfit merge --out {out}: that is a file; choose a new folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ConfigError(f"memfit merge --out {out}: that folder is not empty; choose a new "
                          "folder, or pass --force to replace its contents")
    problem = None if out.is_dir() else creation_problem(out)
    if problem is not None:
        raise ConfigError(f"memfit merge --out {out} cannot be created: {problem}")


def claim_path(out: Path) -> Path:
    """The file whose lock a merge into ``out`` holds while it writes: named after ``out``,
    or after its hash where that name would pass the 255 bytes a file name may have."""
    name = f".{out.name}.memfit-merge.lock"
    if len(os.fsencode(name)) > 255:
        name = f".{hashlib.sha256(os.fsencode(out.name)).hexdigest()[:16]}.memfit-merge.lock"
    return out.parent / name


@contextlib.contextmanager
def _claimed(out: Path) -> Iterator[None]:
    """Be the only merge writing ``out`` until the block ends, or refuse in one line.

    The claim is an exclusive ``flock`` on an empty file beside ``out``. It is opened with
    O_NOFOLLOW, so a link planted at that name is refused, never written through; nothing is
    ever written into it. The kernel drops a lock when its holder dies, so a file a killed
    merge left behind blocks nobody (and the next merge removes it). The holder removes the
    file before it lets go; another merge may have opened that file a moment earlier and get
    the lock once it is released, on a file no longer at that name, which guards nothing: so
    a lock counts only while the name still leads to the locked file (else it lost a race
    with a merge that has just written ``out``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    path = claim_path(out)
    busy = (f"memfit merge --out {out}: another memfit merge into that folder is running; "
            "let it finish, or choose another folder")
    try:
        handle = open_no_follow(path, os.O_RDWR | os.O_CREAT, 0o600)
    except ConfigError as error:  # a link, a FIFO, ... planted at that name
        raise ConfigError(f"memfit merge --out {out}: its lock file: {error}") from None
    except OSError as error:
        raise ConfigError(f"memfit merge --out {out}: cannot create its lock file {path} "
                          f"({error.strerror}); remove whatever is at that name") from None
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(busy) from None
        if not _names(path, handle):
            raise ConfigError(busy)
        try:
            yield
        finally:
            if _names(path, handle):
                path.unlink()
    finally:
        os.close(handle)


def _names(path: Path, handle: int) -> bool:
    """Whether ``path`` (not followed) is the open file ``handle``."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(handle)
    return (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)


def merge_run(run_dir: str | Path, out: str | Path, force: bool = False,
              trust_code: bool = False) -> Path:
    """Write the merged model of ``run_dir`` to ``out``: a new or empty folder, or with
    ``force`` a folder whose contents are replaced — only once the new model is complete
    (written beside it, then swapped in). ``trust_code``: import the code the run's config
    names (``--trust-code``). Every refusal comes before anything is written."""
    run_dir, out = Path(run_dir), Path(out)
    config = run_config(run_dir)
    refuse_untrusted_code(config, f"memfit merge {run_dir}: its config.yaml", trust_code)
    _check_out(run_dir, config, out, force)
    model, tokenizer, is_transformers = merged_model(run_dir, config)
    with _claimed(out):
        # Again: another merge may have written out while this one merged.
        _check_out(run_dir, config, out, force)
        with staged_folder(out) as folder:
            save_model(folder, model, tokenizer, save_pretrained=is_transformers)
    return out
