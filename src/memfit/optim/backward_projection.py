"""GaLore's projected gradient computed inside backward, for the weights of linear layers.

A linear layer y = x W^T + b (W: out x in) with its input flattened to X (T x in, T tokens)
and the gradient of its output D (T x out) has the weight gradient G = D^T X. GaLore only
ever uses R = P^T g, where g is G (out <= in, P: out x r) or G^T (out > in, P: in x r), and
the product can be associated so that G is never formed:

    out <= in:  R = P^T D^T X = (D P)^T X      r x in,   T*r*(out + in) multiply-adds
    out >  in:  R = P^T X^T D = (X P)^T D      r x out

instead of T*out*in for G plus r*out*in for P^T G. With T = r = 128 and a 768 x 2064 MLP
matrix that is 25x fewer, and no full-size gradient of the weight exists at any time.

Which steps go this way is the optimizer's call, made in backward for each weight through
``backward_projection_basis(param)``: a basis P when the gradient may arrive projected,
None when the step needs the full gradient (a step that refreshes P takes its SVD from G;
the online and random projectors need G on every step). Projected gradients are handed
to ``add_projected_gradient(param, R)``, which accumulates them across micro-batches
(summing R over micro-batches equals projecting the summed G, since P is fixed within a
step).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

# Attribute marking a linear layer whose forward was replaced here.
_PATCHED = "_memfit_backward_projection"


class ProjectedGradientSink(Protocol):
    """What an optimizer provides to receive projected gradients from backward."""

    def backward_projection_basis(self, param: torch.Tensor) -> torch.Tensor | None: ...

    def add_projected_gradient(self, param: torch.Tensor, projected: torch.Tensor) -> None: ...


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype autocast would run a linear layer in (x's dtype when autocast is off)."""
    device = x.device.type
    if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


class _ProjectedLinear(torch.autograd.Function):
    """F.linear whose weight gradient may be delivered as R = P^T g to an optimizer."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                sink: ProjectedGradientSink) -> torch.Tensor:
        # Cast as autocast would (and save the casts, as autograd would for F.linear), so
        # activation memory and numerics match the layer's ordinary forward.
        dtype = _compute_dtype(x)
        x_cast, weight_cast = x.to(dtype), weight.to(dtype)
        bias_cast = bias.to(dtype) if bias is not None else None
        with torch.autocast(x.device.type, enabled=False):
            output = F.linear(x_cast, weight_cast, bias_cast)
        ctx.save_for_backward(x_cast, weight_cast)
        ctx.weight, ctx.sink, ctx.has_bias = weight, sink, bias is not None
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight_cast = ctx.saved_tensors
        out_features, in_features = weight_cast.shape
        d = grad_output.reshape(-1, out_features)  # T x out
        grad_x = grad_bias = grad_weight = None
        if ctx.needs_input_grad[0]:
            # autograd casts it to the dtype of the layer's (uncast) input.
            grad_x = grad_output @ weight_cast.to(grad_output.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = d.sum(dim=0)
        if ctx.needs_input_grad[1]:
            flat_x = x.reshape(-1, in_features)  # T x in
            basis = ctx.sink.backward_projection_basis(ctx.weight)
            if basis is None:
                grad_weight = d.T.to(flat_x.dtype) @ flat_x
            else:
                # fp32 throughout: R is accumulated and fed to the optimizer in fp32.
                d32, x32 = d.float(), flat_x.float()
                projected = ((d32 @ basis).T @ x32 if out_features <= in_features
                             else (x32 @ basis).T @ d32)
                ctx.sink.add_projected_gradient(ctx.weight, projected)
        ctx.weight = ctx.sink = None
        return grad_x, grad_weight, grad_bias, None


def _projected_forward(module: nn.Linear, sink: ProjectedGradientSink):
    def forward(x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled() or not module.weight.requires_grad:
            return F.linear(x, module.weight, module.bias)
        return _ProjectedLinear.apply(x, module.weight, module.bias, sink)

    return forward


def project_in_backward(model: nn.Module, sink: ProjectedGradientSink,
                        params: set[int]) -> list[str]:
    """Route the weight gradients of `model`'s nn.Linear layers whose weight id is in
    `params` through `sink`; returns their names.

    Replaces those layers' forward (an instance attribute, so the class is untouched). Any
    earlier routing of this model's layers is undone first, so calling it again for a
    rebuilt optimizer (or with an empty `params`) leaves no stale route behind.
    """
    names = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if getattr(module, _PATCHED, False):
            del module.forward
            delattr(module, _PATCHED)
        if id(module.weight) in params:
            module.forward = _projected_forward(module, sink)
            setattr(module, _PATCHED, True)
            names.append(name)
    return names


def clip_grad_norm_(parameters: list[torch.Tensor], max_norm: float | None,
                    projected: list[torch.Tensor]) -> torch.Tensor:
    """clip_grad_norm_ over the parameters' .grad and the `projected` gradients together
    (max_norm None: only measure). Returns the pre-clip global norm.

    A weight whose gradient arrived projected counts with ||R|| = ||P^T G|| (<= ||G||: the
    part of G its update uses).
    """
    if not projected:  # torch's own (it also handles FSDP's DTensor gradients)
        return torch.nn.utils.clip_grad_norm_(
            parameters, max_norm if max_norm is not None else math.inf)
    tensors = [p.grad for p in parameters if p.grad is not None] + projected
    total = torch.nn.utils.get_total_norm(tensors)
    if max_norm is None:
        return total
    # Same coefficient as torch.nn.utils.clip_grad_norm_, kept as a tensor (no host sync).
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for tensor in tensors:
        tensor.mul_(coefficient.to(tensor.device, tensor.dtype))
    return total
