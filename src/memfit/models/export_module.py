"""``model.export_module``: the submodule of a factory's module that the exports stand for.

A factory often wraps a Hugging Face model in a module whose forward computes the loss
(``self.model = AutoModelForSequenceClassification.from_pretrained(...)``). Naming that
inner model (``model.export_module=model``) makes ``model/`` and ``memfit merge`` write it
as a normal Hugging Face folder, and ``adapter/`` name its modules relative to it, so both
load with transformers and PEFT alone, without the wrapper or memfit.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from torch import nn

from memfit._utils.errors import ModelError


def plain_module(model: nn.Module) -> nn.Module:
    """The factory's module: ``model`` itself, or the one a PEFT model wraps (with its
    adapter layers injected in place)."""
    # peft imports bitsandbytes (~3 s): if it was never imported, no model is a PeftModel
    peft = sys.modules.get("peft")
    return model.get_base_model() if peft and isinstance(model, peft.PeftModel) else model


def module_name(root: nn.Module, module: nn.Module) -> str:
    """The dotted name of ``module`` inside ``root`` ("" for ``root`` itself)."""
    return next(name for name, candidate in root.named_modules() if candidate is module)


def exported_module(model: nn.Module, name: str | None) -> nn.Module:
    """The module the exports of ``model`` (a built model, adapters applied or not) stand
    for: the factory's whole module when ``name`` is None, else its submodule ``name``,
    which must be a transformers PreTrainedModel holding every tensor that trains (what
    lies outside would be learned, then left out of the export). ModelError otherwise."""
    factory_module = plain_module(model)
    if name is None:
        return factory_module
    from transformers import PreTrainedModel

    candidates = ", ".join(_outermost(
        candidate for candidate, module in factory_module.named_modules()
        if candidate and isinstance(module, PreTrainedModel))) or "none"
    try:
        inner = factory_module.get_submodule(name)
    except AttributeError:
        raise ModelError(f"model.export_module={name!r}: the factory's module "
                         f"({type(factory_module).__name__}) has no submodule {name!r}; its "
                         f"transformers models (PreTrainedModel) are at: {candidates}") from None
    if not isinstance(inner, PreTrainedModel):
        raise ModelError(f"model.export_module={name!r} is a {type(inner).__name__}, not a "
                         "transformers PreTrainedModel, so it cannot be saved as a Hugging Face "
                         f"folder; the factory's transformers models are at: {candidates}")
    inside = {id(tensor) for tensor in inner.parameters()}
    outside = [parameter for parameter, tensor in factory_module.named_parameters()
               if tensor.requires_grad and id(tensor) not in inside]
    if outside:
        raise ModelError(f"model.export_module={name!r} leaves out {outside[0]!r}, which trains "
                         f"({len(outside)} trainable tensors lie outside it) and would be lost "
                         f"from the export; keep adapters inside it with adapter.restrict_to="
                         f"[{name}], or name a module that holds everything that trains")
    return inner


def _outermost(names: Iterable[str]) -> list[str]:
    """``names`` (in module order) less those inside another of them."""
    kept: list[str] = []
    for name in names:
        if not any(name.startswith(f"{outer}.") for outer in kept):
            kept.append(name)
    return kept
