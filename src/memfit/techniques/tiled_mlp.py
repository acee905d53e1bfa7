"""Sequence-tiled MLP: each block's MLP runs over ``chunk_tokens`` tokens at a time, in
forward and in backward, so its ``tokens x intermediate`` activations (Llama-3.1-8B:
14,336 per token, gate, up, their product and the adapters' inputs) exist for one chunk
at a time instead of for the whole sequence (Arctic Long Sequence Training's TiledMLP).

An MLP acts on every position alone, so computing it chunk by chunk gives the same
output. Forward runs the chunks without recording a graph and keeps only the MLP's input
(``[batch, seq, hidden]``, which the block keeps anyway); backward recomputes each
chunk with its graph, backpropagates that chunk's output gradient through it and drops
it before the next. Gradients of the trainable parameters inside the MLP (LoRA adapters
on gate/up/down, or the projections themselves) are summed over the chunks and returned
from the one autograd node, so they reach ``.grad`` once per backward: hooks on gradient
accumulation (layer-wise updates, DDP, FSDP2) see one gradient, as without tiling.

The MLPs are the modules whose class name ends in ``MLP`` (LlamaMLP, MistralMLP,
Qwen2MLP, Phi3MLP, GPT2MLP, GPTNeoXMLP, ... and a factory model's own), outermost only;
each instance's ``forward`` is replaced, so parameter names and state_dict keys do not
change. Autocast and the random state (dropout on LoRA inputs) of forward are restored
for the recomputation, as ``torch.utils.checkpoint`` does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from memfit._utils.errors import ConfigError


class TiledForward:
    """An instance-level ``forward`` of an MLP that runs the original chunk by chunk."""

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
        return _TiledMLP.apply(self, hidden, *trainable)


class _TiledMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tiled: TiledForward, hidden: torch.Tensor,
                *trainable: torch.Tensor) -> torch.Tensor:
        ctx.tiled = tiled
        device_type = hidden.device.type
        ctx.autocast = (device_type, torch.is_autocast_enabled(device_type),
                        torch.get_autocast_dtype(device_type))
        ctx.cpu_rng = torch.get_rng_state()
        ctx.device_rng = torch.cuda.get_rng_state(hidden.device) if hidden.is_cuda else None
        ctx.save_for_backward(hidden)  # the MLP's only activation: [batch, seq, hidden]
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


def mlp_modules(model: nn.Module) -> list[nn.Module]:
    """The outermost modules whose class name ends in MLP, in model order."""
    chosen: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if any(name.startswith(outer + ".") for outer, _ in chosen):
            continue
        if type(module).__name__.lower().endswith("mlp"):
            chosen.append((name, module))
    return [module for _, module in chosen]


def apply(model: nn.Module, chunk_tokens: int) -> nn.Module:
    modules = mlp_modules(model)
    if not modules:
        classes = sorted({type(m).__name__ for name, m in model.named_modules() if name})
        raise ConfigError("memory.tiled_mlp=true but no module of this model has a class "
                          f"name ending in MLP (classes here: {', '.join(classes)}); "
                          "set memory.tiled_mlp=false")
    for module in modules:
        if not isinstance(module.__dict__.get("forward"), TiledForward):
            module.forward = TiledForward(module, chunk_tokens)
    return model


def tiled_modules(model: nn.Module) -> int:
    """How many MLPs run tiled (for the "did it apply?" check)."""
    return sum(isinstance(module.__dict__.get("forward"), TiledForward)
               for module in model.modules())


def check_applied(model: nn.Module) -> None:
    if tiled_modules(model) == 0:
        raise ConfigError("memory.tiled_mlp=true but no MLP of this model runs tiled; "
                          "set memory.tiled_mlp=false")
