"""The trained result a user keeps, written via a staging folder, then renamed:

- ``adapter/`` (adapter runs): PEFT's ``adapter_config.json`` and
  ``adapter_model.safetensors`` (loads with ``peft.PeftModel.from_pretrained``), plus
  ``buffers.safetensors`` when the base has persistent buffers: their values as training
  left them, named as in the plain model. BatchNorm running statistics move in train mode
  even in layers whose weights adapters freeze, and PEFT saves only what trains, so this
  file carries them; PEFT ignores it, ``memfit merge`` loads it, and plain PyTorch loads
  it with ``model.load_state_dict(load_file(path), strict=False)``; and ``parts.json``
  when LoRA sits on parts of fused q,k,v projections (``techniques/lora_parts.py``): for
  each such module the rows ``[start, stop)`` of each part, ``{"blocks.0.attn.qkv": {"q":
  [0, 64], "v": [128, 192]}}``. PEFT cannot express row parts: ``memfit merge`` reads this
  file; a plain PEFT user folds ``s * lora_B.<part> @ lora_A.<part>`` into those rows.
- ``model/`` (full fine-tunes): a normal Hugging Face folder, or for plain modules a
  safetensors state dict (parameters and persistent buffers) that loads into the user's
  module class with ``load_state_dict(strict=True)``.

With ``model.export_module`` (models/export_module.py) both describe that submodule of the
factory's module: ``model/`` is its Hugging Face folder, and ``adapter/`` keys its weights
and names its modules relative to it, as PEFT does for a model that is that submodule.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from memfit._utils.atomic import staged_folder, write_text
from memfit._utils.errors import CheckpointError, MemfitWarning
from memfit.checkpoint.state import buffer_state
from memfit.models.export_module import exported_module, module_name, plain_module
from memfit.techniques.lora import peft_target_modules, placed_parts

BUFFERS_FILE = "buffers.safetensors"
PARTS_FILE = "parts.json"
# PEFT keys a saved adapter's weights by their names under PeftModel.base_model.model.
_PEFT_KEY_PREFIX = "base_model.model."


def save_model(folder: Path, model: nn.Module, tokenizer: Any | None,
               save_pretrained: bool, state_dict: dict[str, Tensor] | None = None) -> None:
    """A Hugging Face / PEFT folder (``save_pretrained``), or a safetensors state dict that
    loads into the user's own module class with ``load_state_dict(strict=True)``.
    ``state_dict``: the tensors to write instead of the model's own (a sharded model's,
    gathered whole)."""
    if save_pretrained:
        model.save_pretrained(folder, safe_serialization=True, state_dict=state_dict)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
    else:
        state = {name: tensor.contiguous()
                 for name, tensor in (state_dict or model.state_dict()).items()}
        save_file(state, folder / "model.safetensors")


def export_trained(run_dir: Path, model: nn.Module, tokenizer: Any | None, has_adapter: bool,
                   is_transformers: bool, export_module: str | None = None,
                   state_dict: dict[str, Tensor] | None = None) -> Path:
    """``run_dir/adapter`` or ``run_dir/model`` for the trained ``model``, or for its
    submodule ``export_module`` (model.export_module). ``state_dict``: a sharded model's
    whole state dict, gathered."""
    exported = exported_module(model, export_module)
    final = run_dir / ("adapter" if has_adapter else "model")
    with staged_folder(final) as folder:
        if has_adapter:
            save_model(folder, model, tokenizer, save_pretrained=True, state_dict=state_dict)
            if export_module is not None:
                _rebase_adapter(folder, plain_module(model), exported)
            _save_trained_buffers(folder, model, exported)
            parts = placed_parts(exported)
            if parts:
                write_text(folder / PARTS_FILE, json.dumps(parts, indent=2))
        else:
            save_pretrained = is_transformers or export_module is not None
            save_model(folder, exported, tokenizer, save_pretrained=save_pretrained,
                       state_dict=_state_within(model, exported, state_dict))
    return final


def _state_within(model: nn.Module, module: nn.Module,
                  state_dict: dict[str, Tensor] | None) -> dict[str, Tensor] | None:
    """The part of ``model``'s ``state_dict`` that belongs to ``module``, keyed as
    ``module.state_dict()`` would key it."""
    prefix = module_name(model, module)
    if state_dict is None or not prefix:
        return state_dict
    return {key.removeprefix(f"{prefix}."): tensor for key, tensor in state_dict.items()
            if key.startswith(f"{prefix}.")}


def _plain_buffer_names(model: nn.Module, root: nn.Module) -> dict[str, str]:
    """Each buffer under ``root`` (inside the adapted ``model``): its name in ``model`` ->
    its name in the plain ``root`` that ``merge_and_unload`` leaves, where
    an adapter layer's base layer stands in the adapter layer's place. Buffers of modules
    trained in full (adapter.trainable_modules) are left out: PEFT saves those copies,
    buffers included, in its own file."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import AuxiliaryTrainingWrapper

    full_names = {id(module): name for name, module in model.named_modules()}
    found: dict[str, str] = {}

    def visit(module: nn.Module, plain: str) -> None:
        if isinstance(module, AuxiliaryTrainingWrapper):
            return
        if isinstance(module, BaseTunerLayer):
            visit(module.get_base_layer(), plain)
            return
        full = full_names[id(module)]
        for name, _ in module.named_buffers(recurse=False):
            found[f"{full}.{name}" if full else name] = plain + name
        for name, child in module.named_children():
            visit(child, f"{plain}{name}.")

    visit(root, "")
    return found


def _save_trained_buffers(folder: Path, model: nn.Module, exported: nn.Module) -> None:
    """``buffers.safetensors``: the persistent buffers of the exported module's base."""
    buffers = buffer_state(model)  # persistent ones only, named in the adapted model
    plain = {plain_name: buffers[name]
             for name, plain_name in _plain_buffer_names(model, exported).items()
             if name in buffers}
    if plain:
        save_file(plain, folder / BUFFERS_FILE)


def _rebase_adapter(folder: Path, factory_module: nn.Module, inner: nn.Module) -> None:
    """Rewrite PEFT's two files, saved for the factory's whole module, to describe ``inner``
    alone: what PEFT would have saved had ``inner`` itself been adapted."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import AuxiliaryTrainingWrapper

    wrappers = [name for name, module in inner.named_modules()
                if isinstance(module, (BaseTunerLayer, AuxiliaryTrainingWrapper))]
    adapted = [name for name, module in inner.named_modules()
               if isinstance(module, BaseTunerLayer)]
    trained = [name for name, module in inner.named_modules()
               if isinstance(module, AuxiliaryTrainingWrapper)]
    # The names of inner's modules as they are without adapters (a wrapper's inside left out)
    plain = [name for name, _ in inner.named_modules()
             if name and not any(name.startswith(f"{wrapper}.") for wrapper in wrappers)]
    config_path = folder / "adapter_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["target_modules"] = peft_target_modules(adapted, plain)
    config["modules_to_save"] = trained or None
    write_text(config_path, json.dumps(config, indent=2, sort_keys=True))
    weights_path = folder / "adapter_model.safetensors"
    old = f"{_PEFT_KEY_PREFIX}{module_name(factory_module, inner)}."
    weights = {_PEFT_KEY_PREFIX + key.removeprefix(old): tensor
               for key, tensor in load_file(weights_path).items()}
    save_file(weights, weights_path, metadata={"format": "pt"})


def load_trained_buffers(adapter_dir: Path, model: nn.Module) -> None:
    """Copy ``adapter_dir/buffers.safetensors`` into the plain (merged) ``model``. Without
    the file (an adapter exported before memfit wrote it) a model with buffers keeps the
    values it was built with, which is said in a warning."""
    path = adapter_dir / BUFFERS_FILE
    if not path.is_file():
        if buffer_state(model):
            warnings.warn(f"{adapter_dir} has no {BUFFERS_FILE} (exported by an older memfit): "
                          "the merged model keeps its buffers (e.g. BatchNorm running "
                          "statistics) as built, not as training left them", MemfitWarning,
                          stacklevel=2)
        return
    try:
        saved = load_file(path)
    except SafetensorError as error:
        raise CheckpointError(f"{path}: not a readable safetensors file ({error})") from None
    expected = buffer_state(model)
    for name, tensor in saved.items():
        if name not in expected or expected[name].shape != tensor.shape:
            found = f"shape {tuple(expected[name].shape)}" if name in expected else "no such buffer"
            raise CheckpointError(f"{path} holds {name!r} of shape {tuple(tensor.shape)}, but the "
                                  f"merged model has {found} (was the adapter trained on "
                                  "another model?)")
    model.load_state_dict(saved, strict=False)
