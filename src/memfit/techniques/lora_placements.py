"""Named LoRA placements for encoder-decoder models (autoencoders), usable as entries of
``adapter.targets`` beside the kinds of ``techniques.lora``:

- ``encoder``: every Linear / Conv layer of the encoder;
- ``encoder-late``: those of the later half of the encoder's block stack, and any after
  it (e.g. the projection into the bottleneck) — adapting high-level features while the
  early, low-level filters stay as pretrained;
- ``decoder``: every Linear / Conv layer of the decoder.

The encoder (decoder) is the outermost module named ``encoder`` (``decoder``), e.g. the
built-in conv-autoencoder / vit-autoencoder or ``model.vit.encoder``; its block stack is
its ModuleList / Sequential with the most children. ``attention-qv`` is a kind already.
"""

from __future__ import annotations

from torch import nn

from memfit._utils.errors import ConfigError

PLACEMENTS = ("encoder", "encoder-late", "decoder")


def placed_modules(model: nn.Module, targets: tuple[str, ...], candidates: list[str]
                   ) -> dict[str, set[str]]:
    """For each placement named in ``targets``: the names among ``candidates`` (the model's
    adaptable modules, in model order) it chooses."""
    return {target: set(_choose(model, target, candidates))
            for target in targets if target in PLACEMENTS}


def _choose(model: nn.Module, placement: str, candidates: list[str]) -> list[str]:
    part_name = "decoder" if placement == "decoder" else "encoder"
    part, prefix = _outermost(model, part_name, placement)
    inside = [name for name in candidates if (name + ".").startswith(prefix)]
    if placement != "encoder-late":
        return inside
    stacks = [(name, module) for name, module in part.named_modules()
              if isinstance(module, (nn.ModuleList, nn.Sequential)) and len(module) > 1]
    if not stacks:  # no block stack: the later half of the layers
        return inside[len(inside) // 2:]
    # The block stack: the outermost container (the part itself, if it is one), the
    # longest among equally outer ones; e.g. "blocks", not a block's "mlp" Sequential.
    stack_name, stack = min(stacks, key=lambda item: (_depth(item[0]), -len(item[1])))
    stack_prefix = prefix + (stack_name + "." if stack_name else "")
    children = [name for name, _ in stack.named_children()]
    late = tuple(f"{stack_prefix}{child}." for child in children[len(children) // 2:])
    in_stack = [name for name in inside if name.startswith(stack_prefix)]
    after_stack = inside[inside.index(in_stack[-1]) + 1:] if in_stack else []
    return [name for name in in_stack if (name + ".").startswith(late)] + after_stack


def _depth(name: str) -> int:
    return name.count(".") + 1 if name else 0


def _outermost(model: nn.Module, part_name: str, placement: str) -> tuple[nn.Module, str]:
    """The outermost module whose own name is ``part_name`` and its name prefix."""
    found = [(name, module) for name, module in model.named_modules()
             if name.rsplit(".", 1)[-1] == part_name]
    if not found:
        tops = ", ".join(name for name, _ in model.named_children())
        raise ConfigError(f"adapter.targets={placement} needs a module named '{part_name}'; "
                          f"this model's top-level parts are: {tops}")
    name, module = min(found, key=lambda item: _depth(item[0]))
    return module, name + "."
