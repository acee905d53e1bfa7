"""Sequence-tiled MLP (techniques/tiled.py): each block's MLP runs over ``chunk_tokens``
tokens at a time, so its ``tokens x intermediate`` activations (Llama-3.1-8B: 14,336 per
token, gate, up, their product and the adapters' inputs) exist for one chunk at a time.

The MLPs are the modules whose class name ends in ``MLP`` (LlamaMLP, MistralMLP,
Qwen2MLP, Phi3MLP, GPT2MLP, GPTNeoXMLP, ... and a factory model's own), outermost only.
"""

from __future__ import annotations

from torch import nn

from memfit.techniques.tiled import check_tiled, outermost, runs_tiled, tile_or_refuse


def mlp_modules(model: nn.Module) -> list[nn.Module]:
    return outermost(model, ("mlp",))


def apply(model: nn.Module, chunk_tokens: int) -> nn.Module:
    return tile_or_refuse(model, mlp_modules(model), chunk_tokens, "memory.tiled_mlp", "MLP")


def tiled_modules(model: nn.Module) -> int:
    """How many MLPs run tiled."""
    return sum(runs_tiled(module) for module in mlp_modules(model))


def check_applied(model: nn.Module) -> None:
    check_tiled(mlp_modules(model), "memory.tiled_mlp", "MLP")
