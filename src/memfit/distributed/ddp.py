"""Data parallel (``distributed.strategy=ddp``): every process holds the whole model and
optimizer, runs its slice of every micro-batch, and the gradients are SUMMED across
processes before the update (the loop divides every micro-batch's loss sum by the item
count of the GLOBAL effective batch, so the sum is the global mean's gradient).

Who reduces which gradient:

- PyTorch ``DistributedDataParallel``, for the ordinary parameters. It wraps a small module
  whose forward is the step's whole loss (``_LossModule``), so chunked loss and any loss
  that reaches into the model go through DDP's forward. ``gradient_as_bucket_view=True``:
  the ``.grad`` tensors are views into DDP's flat buckets, so no gradient is held twice.
  ``no_sync()`` on every micro-batch but the last: earlier ones accumulate locally. A comm
  hook sums (DDP's default hook averages) and counts the bytes.
- memfit itself, for what DDP cannot see or would send whole:
  - GaLore weights whose gradient arrives projected from backward (R = P^T G, r x n,
    ``optim/backward_projection.py``): R is all-reduced instead of G (m x n) on steps that
    keep P; on steps that refresh P their full gradient is reduced, so every rank takes
    its SVD from the same sum and derives bitwise the same P.
  - input embeddings (vocab x hidden): a step's tokens touch few rows, and the other rows'
    gradient is exactly zero on every process, so only the rows some process touched are
    summed (one byte per row says which) — exact, and a fraction of the table's bytes.
  - layer-wise updates (``optim/layerwise.py``), which step each parameter inside backward:
    its hook starts an asynchronous all-reduce of the finished gradient and the update runs
    once it completes (while the next parameter's reduction is in flight). DDP is not used.

Frozen weights are neither reduced nor broadcast (every rank builds them from the same
files and seed); the trainable ones start equal because every rank seeds alike, and DDP
(or, without DDP, ``_broadcast_from_main``) copies rank 0's anyway.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer

Batch = dict[str, torch.Tensor]
LossSum = Callable[[nn.Module, Batch], torch.Tensor]


class ReducedBytes:
    """Bytes this process has all-reduced since the last ``take()`` (one step's)."""

    def __init__(self) -> None:
        self._bytes = 0

    def all_reduce(self, tensor: torch.Tensor,
                   op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> dist.Work:
        """Start reducing ``tensor`` (summing, by default) over all processes, in place;
        wait on the handle."""
        self._bytes += tensor.numel() * tensor.element_size()
        return dist.all_reduce(tensor, op=op, async_op=True)

    def take(self) -> int:
        taken, self._bytes = self._bytes, 0
        return taken


def _summing_hook(ledger: ReducedBytes, bucket):  # noqa: ANN001, ANN201
    """DDP comm hook: the ``dist.GradBucket`` summed over processes (not averaged), bytes
    counted. Unannotated: DDP compares annotations with the classes themselves, and this
    module's are strings (``from __future__ import annotations``)."""
    return ledger.all_reduce(bucket.buffer()).get_future().then(lambda done: done.value()[0])


class _LossModule(nn.Module):
    """``loss_sum(model, batch)`` as a module's forward, for DDP to wrap."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, loss_sum: LossSum, batch: Batch) -> torch.Tensor:
        return loss_sum(self.model, batch)


def _reduced_by_memfit(optimizer: Optimizer, projects_in_backward: bool) -> list[nn.Parameter]:
    """The trainable parameters memfit reduces whole (see the module docstring): every one
    under layer-wise updates, GaLore's weights projected in backward."""
    if getattr(optimizer, "steps_in_backward", False):
        return [p for group in optimizer.param_groups for p in group["params"]]
    if not projects_in_backward:
        return []
    return [p for group in optimizer.param_groups if group.get("project")
            for p in group["params"]]


def embedding_weights(model: nn.Module) -> list[nn.Parameter]:
    """Trainable ``nn.Embedding`` weights that no other module shares: only the rows of
    the tokens a micro-batch holds get a gradient (a tied output head's is dense)."""
    holders: dict[int, int] = {}
    for module in model.modules():
        for parameter in module._parameters.values():
            if parameter is not None:
                holders[id(parameter)] = holders.get(id(parameter), 0) + 1
    return [module.weight for module in model.modules()
            if isinstance(module, nn.Embedding) and module.weight.requires_grad
            and holders[id(module.weight)] == 1]


def _broadcast_from_main(parameters: list[nn.Parameter]) -> None:
    with torch.no_grad():
        for parameter in parameters:
            dist.broadcast(parameter.data, src=0)


class Replicas:
    """What one training step does differently under data parallel
    (``training/step.py``): ``forward`` the loss, inside ``micro_batch(last)`` around
    forward and backward, then ``after_backward()`` after the last micro-batch."""

    def __init__(self, model: nn.Module, optimizer: Optimizer, projects_in_backward: bool,
                 device: torch.device):
        self.reduced_bytes = ReducedBytes()
        self._optimizer = optimizer
        self._layerwise = getattr(optimizer, "steps_in_backward", False)
        own_ids = {id(p) for p in _reduced_by_memfit(optimizer, projects_in_backward)}
        self._embeddings = [] if self._layerwise else [
            p for p in embedding_weights(model) if id(p) not in own_ids]
        # memfit's dense reductions after backward, in model order (the same on every rank).
        self._dense = [p for p in model.parameters() if id(p) in own_ids]
        own_ids |= {id(p) for p in self._embeddings}
        # Frozen weights and memfit's own: DDP neither reduces nor broadcasts them.
        ignored = {name for name, p in model.named_parameters()
                   if not p.requires_grad or id(p) in own_ids}
        self._by_ddp = [p for name, p in model.named_parameters() if name not in ignored]
        self._ddp: DistributedDataParallel | None = None
        if self._by_ddp:
            wrapped = _LossModule(model)
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
                wrapped, [f"model.{name}" for name in ignored])
            self._ddp = DistributedDataParallel(
                wrapped, device_ids=[device.index] if device.type == "cuda" else None,
                gradient_as_bucket_view=True)
            self._ddp.register_comm_hook(self.reduced_bytes, _summing_hook)
        if self._dense or self._embeddings:
            _broadcast_from_main([*self._dense, *self._embeddings])
        if self._layerwise:  # its hooks reduce
            optimizer.reduce_across_processes(self.reduced_bytes.all_reduce)

    def forward(self, loss_sum: LossSum, model: nn.Module, batch: Batch) -> torch.Tensor:
        return self._ddp(loss_sum, batch) if self._ddp is not None else loss_sum(model, batch)

    @contextlib.contextmanager
    def micro_batch(self, last: bool) -> Iterator[None]:
        """DDP reduces in the last micro-batch's backward only; the others accumulate."""
        with (self._ddp.no_sync() if self._ddp is not None and not last
              else contextlib.nullcontext()):
            yield

    def after_backward(self) -> None:
        """Sum what DDP did not: the projected gradients GaLore took from backward, the
        full gradients of its weights on refresh steps, and the embeddings' touched rows
        (layer-wise updates already summed theirs)."""
        if self._layerwise:
            return
        tensors = [p.grad for p in self._dense if p.grad is not None]
        tensors += getattr(self._optimizer, "projected_gradients", list)()
        started = [self.reduced_bytes.all_reduce(tensor) for tensor in tensors]
        for parameter in self._embeddings:
            if parameter.grad is not None:  # None on every rank alike (same graph)
                self._sum_touched_rows(parameter.grad)
        for work in started:
            work.wait()

    def _sum_touched_rows(self, grad: torch.Tensor) -> None:
        """Sum an embedding's gradient (vocab x hidden) over the processes by its rows that
        are non-zero on some process: the others are zero everywhere, so the result is
        the dense sum, at (touched rows x hidden) + one byte per row of traffic instead of
        the whole table."""
        touched = grad.ne(0).any(dim=1).to(torch.uint8)  # vocab
        self.reduced_bytes.all_reduce(touched, op=dist.ReduceOp.MAX).wait()
        rows = touched.nonzero().squeeze(1)
        summed = grad.index_select(0, rows)  # touched x hidden
        self.reduced_bytes.all_reduce(summed).wait()
        grad.index_copy_(0, rows, summed)

    def zero_grad(self) -> None:
        """The optimizer's ``zero_grad(set_to_none=True)``, except that DDP's gradients are
        zeroed in place: they stay views of its buckets, so the micro-batches under
        ``no_sync`` accumulate into the buckets. Set to None, each would be rebuilt as a
        fresh tensor beside its bucket (every gradient held twice while accumulating)."""
        kept = [(p, p.grad) for p in self._by_ddp if p.grad is not None]
        self._optimizer.zero_grad(set_to_none=True)
        for parameter, grad in kept:
            parameter.grad = grad.zero_()

    def close(self) -> None:
        """Drop DDP (its reducer holds the process group) while the group still exists:
        a gloo group freed after ``destroy_process_group`` can hang joining its threads,
        and a failed run's traceback would otherwise keep DDP alive past the teardown."""
        self._ddp = None
