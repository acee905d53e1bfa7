"""torch's Adafactor, able to step FSDP2 row shards as if it held each whole parameter.

The algorithm (torch.optim.Adafactor, single-tensor path): at step t, with
w = t^beta2_decay, rho = min(lr, 1 / sqrt(t)) and G the gradient of a parameter P,

* a parameter of 2 or more dims keeps a factored second moment over its last two dims:
  R = lerp(R, mean(G^2, dim=-1), w) (one value per row) and
  C = lerp(C, mean(G^2, dim=-2), w) (one per column), and estimates the variance of each
  element as V = R @ C / max(mean(R, dim=-2), eps1);
* a vector (or scalar) keeps a plain second moment V = lerp(V, G^2, w);
* the update U = G / max(sqrt(V), eps1) is scaled down to an RMS of at most ``d``, and
  P <- P * (1 - lr * weight_decay) - alpha * U with alpha = max(eps2, RMS(P)) * rho (RMS
  of P before the decay).

FSDP2 shards every parameter along dim 0 (``RowShard``); a process steps its own rows as
plain tensors. Everything above that reads across dim 0 is a sum over the whole tensor:
RMS(P) and RMS(U) for every parameter, and, for a 2-D parameter only (where dim -2 is
dim 0), mean(G^2, dim=-2) and mean(R, dim=-2). Those are summed over the processes; the
rest (R of the local rows, C of a conv weight whose dims -2 and -1 are not dim 0, V of a
vector's local elements) is local. Per sharded parameter and step that is one all-reduce
of 2 numbers (the squared norms of P and U), plus, before it for a 2-D parameter, one of
n + 1 numbers (n column sums of G^2 and the sum of R). Every process holding a shard
makes them in the same order, a process with 0 rows included, so every process must have
a gradient for the same parameters.

Without shards the step is torch's operation for operation, and the state (keys, dtypes,
shapes) and param_groups are torch's, so a state_dict saved by one loads into the other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from memfit._utils.errors import ConfigError
from memfit.optim.row_shards import RowShard


class Adafactor(torch.optim.Optimizer):
    """torch.optim.Adafactor(foreach=False, maximize=False), whose parameters may be row
    shards declared with ``set_row_shards``."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-2, beta2_decay: float = -0.8,
                 eps: tuple[float | None, float] = (None, 1e-3), d: float = 1.0,
                 weight_decay: float = 0.0) -> None:
        # foreach and maximize are not options: they sit in every group at the values this
        # class implements so that torch's Adafactor, which reads them, loads our
        # state_dict and steps the same way.
        defaults = {"lr": lr, "beta2_decay": beta2_decay, "eps": eps, "d": d,
                    "weight_decay": weight_decay, "foreach": False, "maximize": False}
        super().__init__(params, defaults)
        self._shards: dict[torch.Tensor, RowShard] = {}

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        _check_group(self.param_groups[-1])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        for group in self.param_groups:  # a torch state_dict may hold maximize=True
            _check_group(group)

    def set_row_shards(self, shards: dict[torch.Tensor, RowShard]) -> None:
        """Declare that each parameter (a plain tensor of this optimizer) holds the rows
        ``shard.start : shard.start + shard.rows`` of a tensor of ``shard.full_shape``.
        Adds to (or replaces for the same parameter) earlier declarations."""
        managed = {id(p) for group in self.param_groups for p in group["params"]}
        for param, shard in shards.items():
            if id(param) not in managed:
                raise ValueError("set_row_shards: a parameter is not in this optimizer")
            local_shape = (shard.rows, *shard.full_shape[1:])
            if param.shape != local_shape:
                raise ValueError(f"set_row_shards: parameter of shape {tuple(param.shape)} "
                                 f"is not {local_shape}, rows {shard.start}.. of "
                                 f"{tuple(shard.full_shape)}")
            self._shards[param] = shard

    def state_placement(self, param: torch.Tensor, key: str) -> int | None:
        """The dim of ``self.state[param][key]`` divided over the processes as the
        parameter's rows are (0), or None where every process holds the same whole value:
        the step, and the column statistic of a 2-D parameter (a mean over its rows)."""
        if key == "step" or (key == "col_var" and param.dim() == 2):
            return None
        if key in ("row_var", "col_var") and param.dim() > 1:
            return 0
        if key == "variance" and param.dim() <= 1:
            return 0 if param.dim() == 1 else None  # a 0-d parameter is never divided
        raise KeyError(f"Adafactor keeps no {key!r} for a {param.dim()}-D parameter")

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            eps1, eps2 = group["eps"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                if param.grad.is_sparse:
                    raise ConfigError("Adafactor does not support sparse gradients")
                if eps1 is None:
                    # As torch does: the first parameter stepped in the group picks eps1
                    # for all of the group's parameters in this step.
                    eps1 = torch.finfo(param.dtype).eps
                self._step_parameter(param, group, eps1, eps2)
        return loss

    def _step_parameter(self, param: torch.Tensor, group: dict[str, Any], eps1: float,
                        eps2: float) -> None:
        grad = param.grad
        state = self.state[param]
        if not state:
            _init_state(state, grad)
        shard = self._shards.get(param)
        lr = float(group["lr"])

        step_t = state["step"]
        step_t += 1
        step = step_t.item()
        one_minus_beta2 = step ** group["beta2_decay"]
        rho = min(lr, 1 / (step**0.5))
        # alpha reads the parameter before the decay; .item() waits until it is needed
        param_norm = param.norm(2)  # 0-d; of the local rows when sharded
        if group["weight_decay"] != 0:
            param.mul_(1 - lr * group["weight_decay"])

        if grad.dim() > 1:
            var_estimate = _factored_variance(grad, state["row_var"], state["col_var"],
                                              shard, one_minus_beta2, eps1)
        else:
            variance = state["variance"]
            variance.lerp_(grad * grad, one_minus_beta2)
            var_estimate = variance.clone()  # the update is built in place below
        # eps1 is squared because of the square root after
        update = var_estimate.clamp_(min=eps1 * eps1).rsqrt_()
        update.mul_(grad)
        update_norm = update.norm(2)

        if shard is None:
            norms = [param_norm.item(), update_norm.item()]
            numel = update.numel()
        else:
            # Squared norms of row blocks add up to the whole tensor's: one all-reduce.
            squares = torch.stack([param_norm.to(_sum_dtype(param)),
                                   update_norm.to(_sum_dtype(param))]).square_()
            norms = shard.sum_(squares).sqrt_().tolist()
            numel = shard.full_shape.numel()
        whole_param_norm, whole_update_norm = norms
        alpha = max(eps2, whole_param_norm / (numel**0.5)) * rho
        denom = max(1.0, whole_update_norm / ((numel**0.5) * group["d"]))
        param.add_(update, alpha=-alpha / denom)


def _check_group(group: dict[str, Any]) -> None:
    """torch's bounds for the hyperparameters, and what this class does not implement."""
    eps1, eps2 = group["eps"]
    if not group["lr"] >= 0:
        raise ConfigError(f"Adafactor lr={group['lr']!r} must be >= 0")
    if not group["beta2_decay"] <= 0:
        raise ConfigError(f"Adafactor beta2_decay={group['beta2_decay']!r} must be <= 0")
    if (eps1 is not None and not eps1 >= 0) or not eps2 >= 0:
        raise ConfigError(f"Adafactor eps={group['eps']!r} must be (None or >= 0, >= 0)")
    if not group["d"] >= 1:
        raise ConfigError(f"Adafactor d={group['d']!r} must be >= 1")
    if not group["weight_decay"] >= 0:
        raise ConfigError(f"Adafactor weight_decay={group['weight_decay']!r} must be >= 0")
    if group["maximize"]:
        raise ConfigError("Adafactor maximize=True is not supported; negate the loss")
    if any(torch.is_complex(p) for p in group["params"]):
        raise ConfigError("Adafactor does not support complex parameters")


def _init_state(state: dict[str, torch.Tensor], grad: torch.Tensor) -> None:
    """torch's initial state: same keys, dtypes and shapes (of the local rows)."""
    # torch keeps the step as a 0-d tensor on the CPU, float64 only under a float64 default
    step_dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    state["step"] = torch.tensor(0.0, dtype=step_dtype)
    if grad.dim() > 1:
        state["row_var"] = grad.new_zeros((*grad.shape[:-1], 1))  # (..., rows, 1)
        state["col_var"] = grad.new_zeros((*grad.shape[:-2], 1, grad.shape[-1]))  # (..., 1, n)
    else:
        state["variance"] = torch.zeros_like(grad, memory_format=torch.preserve_format)


def _sum_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The dtype of partial sums sent to other processes: at least float32, so that adding
    the shards' bf16 partial results rounds no more than torch's own reduction does."""
    return torch.promote_types(tensor.dtype, torch.float32)


def _factored_variance(grad: torch.Tensor, row_var: torch.Tensor, col_var: torch.Tensor,
                       shard: RowShard | None, one_minus_beta2: float,
                       eps1: float) -> torch.Tensor:
    """Update row_var (..., rows, 1) and col_var (..., 1, n) with ``grad`` (..., rows, n)
    and return the variance estimate, of grad's shape."""
    # (g * g).mean(dim=-1) without a temporary of grad's size
    row_mean = torch.norm(grad, dim=-1, keepdim=True).square_().div_(grad.size(-1))
    row_var.lerp_(row_mean, one_minus_beta2)
    if shard is None or grad.dim() > 2:
        # dim -2 is not the sharded dim 0 (or nothing is sharded): the means are local
        col_mean = torch.norm(grad, dim=-2, keepdim=True).square_().div_(grad.size(-2))
        row_var_mean = row_var.mean(dim=-2, keepdim=True)
    else:
        # dim -2 is dim 0: the column sums of grad^2 (n) and the sum of row_var (1) are
        # partial here; one all-reduce completes both.
        columns = grad.size(-1)
        sums = torch.cat([torch.norm(grad, dim=0).square_(), row_var.sum(dim=0)])
        sums = shard.sum_(sums.to(_sum_dtype(grad))).div_(shard.full_shape[0])
        col_mean = sums[:columns].view(1, columns).to(col_var.dtype)
        row_var_mean = sums[columns:].view(1, 1).to(row_var.dtype)
    col_var.lerp_(col_mean, one_minus_beta2)
    var_estimate = row_var @ col_var  # (..., rows, 1) @ (..., 1, n)
    return var_estimate.div_(row_var_mean.clamp_(min=eps1))
