"""Sequence tiling of a module that acts on every position alone (an MLP, a norm): its
``forward`` is replaced by one that runs the original over ``chunk_tokens`` tokens at a
time, in forward and in backward, so the activations and temporaries it makes per token
exist for one chunk at a time instead of for the whole sequence (Arctic Long Sequence
Training's TiledMLP, for any position-wise module).

Acting on each position alone, the chunks give the same output. Forward runs them without
recording a graph and keeps only the module's input (``[batch, seq, hidden]``, which the
block usually keeps anyway); backward recomputes each chunk with its graph,
backpropagates that chunk's output gradient through it and drops it before the next.
Gradients of the trainable parameters inside (LoRA adapters, the projections, a norm's
weight) are summed over the chunks and returned from the one autograd node, so they reach
``.grad`` once per backward: hooks on gradient accumulation (layer-wise updates, DDP,
FSDP2) see one gradient, as without tiling. Autocast and the random state (dropout on
LoRA inputs) of forward are restored for the recomputation, as ``torch.utils.checkpoint``
does. Each instance's ``forward`` is replaced, so parameter names and state_dict keys do
not change; a micro-batch of at most ``chunk_tokens`` tokens runs untiled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memfit._utils.errors import ConfigError


class TiledForward:
    """An instance-level ``forward`` of a position-wise module that runs the original chunk
    by chunk."""

    def __init__(self, module: nn.Module, chunk_tokens: int):
        self.module = module
        self.original = module.forward
        self.chunk_tokens = chunk_tokens

    def __call__(self, hidden: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if (args or kwargs or not isinstance(hidden, torch.Tensor) or hidden.dim() < 2
                or _tokens(hidden) <= self.chunk_tokens):
            return self.original(hidden, *args, **kwargs)  # one chunk: nothing to tile
        # The parameters that train, found now: adapters may have been added after tiling.
        trainable = [p for p in self.module.parameters() if p.requires_grad]
        return _Tiled.apply(self, hidden, *trainable)


class _Tiled(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tiled: TiledForward, hidden: torch.Tensor,
                *trainable: torch.Tensor) -> torch.Tensor:
        ctx.tiled = tiled
        device_type = hidden.device.type
        ctx.autocast = (device_type, torch.is_autocast_enabled(device_type),
                        torch.get_autocast_dtype(device_type))
        ctx.cpu_rng = torch.get_rng_state()
        ctx.device_rng = torch.cuda.get_rng_state(hidden.device) if hidden.is_cuda else None
        ctx.save_for_backward(hidden)  # the module's only activation: [batch, seq, hidden]
        output = None
        for start, piece in _chunks(hidden, tiled.chunk_tokens):
            out = tiled.original(piece)  # [1, chunk, out]; no graph in Function.forward
            if output is None:
                output = out.new_empty((_tokens(hidden), out.size(-1)))
            output[start:start + out.size(1)] = out[0]
        return output.view(*hidden.shape[:-1], output.size(-1))

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (hidden,) = ctx.saved_tensors
        tiled = ctx.tiled
        trainable = [p for p in tiled.module.parameters() if p.requires_grad]
        wants_input_grad = ctx.needs_input_grad[1]
        grad_flat = grad_output.reshape(-1, grad_output.size(-1))  # [tokens, out]
        grad_hidden = None  # [tokens, hidden], filled chunk by chunk
        if wants_input_grad:
            grad_hidden = hidden.new_empty((_tokens(hidden), hidden.size(-1)))
        sums: list[torch.Tensor | None] = [None] * len(trainable)
        device_type, autocast_on, autocast_dtype = ctx.autocast
        devices = [hidden.device] if ctx.device_rng is not None else []
        with torch.random.fork_rng(devices=devices, device_type=device_type):
            torch.set_rng_state(ctx.cpu_rng)
            if ctx.device_rng is not None:
                torch.cuda.set_rng_state(ctx.device_rng, hidden.device)
            for start, piece in _chunks(hidden, tiled.chunk_tokens):
                piece = piece.detach().requires_grad_(wants_input_grad)
                inputs = ([piece] if wants_input_grad else []) + trainable
                with torch.enable_grad(), torch.autocast(device_type, dtype=autocast_dtype,
                                                         enabled=autocast_on):
                    out = tiled.original(piece)  # this chunk's graph, freed after grad()
                grads = torch.autograd.grad(out, inputs,
                                            grad_flat[start:start + out.size(1)].unsqueeze(0),
                                            allow_unused=True)
                if wants_input_grad:
                    grad_hidden[start:start + out.size(1)] = grads[0][0]
                    grads = grads[1:]
                for index, grad in enumerate(grads):
                    if grad is not None:
                        sums[index] = grad if sums[index] is None else sums[index].add_(grad)
        if grad_hidden is not None:
            grad_hidden = grad_hidden.view(hidden.shape)
        return (None, grad_hidden, *sums)


def _tokens(hidden: torch.Tensor) -> int:
    return hidden.numel() // hidden.size(-1)


def _chunks(hidden: torch.Tensor, chunk_tokens: int):
    """(first token, [1, chunk, hidden] view) over the tokens of every sequence, in order."""
    flat = hidden.reshape(-1, hidden.size(-1))  # [batch * seq, hidden]; a view when contiguous
    for start in range(0, flat.size(0), chunk_tokens):
        yield start, flat[start:start + chunk_tokens].unsqueeze(0)


@dataclass(frozen=True)
class Tiling:
    """Which modules one technique tiles: the outermost whose class name ends in one of
    ``suffixes`` (lower case); ``key`` switches it on, ``named`` and ``what`` word its
    refusals."""

    key: str  # memory.tiled_mlp
    suffixes: tuple[str, ...]  # ("mlp",)
    named: str  # "MLP": the class-name ending, in the refusal
    what: str  # "MLP": one such module, in the "did it apply?" refusal

    def modules(self, model: nn.Module) -> list[nn.Module]:
        chosen: list[str] = []
        found: list[nn.Module] = []
        for name, module in model.named_modules():
            if any(name.startswith(outer + ".") for outer in chosen):
                continue
            if type(module).__name__.lower().endswith(self.suffixes):
                chosen.append(name)
                found.append(module)
        return found

    def apply(self, model: nn.Module, chunk_tokens: int) -> nn.Module:
        """Tile the modules; none: the key is refused, naming the classes the model has."""
        modules = self.modules(model)
        if not modules:
            classes = sorted({type(m).__name__ for name, m in model.named_modules() if name})
            raise ConfigError(f"{self.key}=true but no module of this model has a class name "
                              f"ending in {self.named} (classes here: {', '.join(classes)}); "
                              f"set {self.key}=false")
        _without_hub_kernels(model)
        for module in modules:
            if not runs_tiled(module):
                module.forward = TiledForward(module, chunk_tokens)
        return model

    def tiled(self, model: nn.Module) -> int:
        """How many of the modules run tiled."""
        return sum(runs_tiled(module) for module in self.modules(model))

    def check_applied(self, model: nn.Module) -> None:
        if not self.tiled(model):
            raise ConfigError(f"{self.key}=true but no {self.what} of this model runs tiled; "
                              f"set {self.key}=false")


def runs_tiled(module: nn.Module) -> bool:
    return isinstance(module.__dict__.get("forward"), TiledForward)


def _without_hub_kernels(model: nn.Module) -> None:
    """Switch off transformers' kernelization (models/torch_forwards.py) in any model inside
    ``model``, e.g. one a factory loaded itself: it would drop the tiled forwards at the
    next train() / eval(). Switching it off restores the torch forwards, so it comes first."""
    for module in model.modules():
        if getattr(module, "use_kernels", False):
            module.use_kernels = False
