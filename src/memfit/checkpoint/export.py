"""The trained result a user keeps: ``adapter/`` (PEFT format, loads with
``peft.PeftModel.from_pretrained``) or ``model/`` (a normal Hugging Face folder, or a
safetensors state dict for plain modules). Written via a staging folder, then renamed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from safetensors.torch import save_file
from torch import Tensor, nn

from memfit._utils.atomic import staged_folder


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
                   is_transformers: bool, state_dict: dict[str, Tensor] | None = None) -> Path:
    final = run_dir / ("adapter" if has_adapter else "model")
    with staged_folder(final) as folder:
        save_model(folder, model, tokenizer, save_pretrained=has_adapter or is_transformers,
                   state_dict=state_dict)
    return final
