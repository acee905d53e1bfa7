"""torch's AdamW (foreach) whose step never needs scratch the size of all parameters.

torch.optim.AdamW(foreach=True) updates a whole parameter group with one call per
operation, and its denominator sqrt(exp_avg_sq) is computed for every tensor of the group
at once: a temporary as large as the group (+194 MiB on the 69M-parameter Llama of the
benchmarks; about 25 GiB on Llama-2-7B in fp32, LOMO Table 1 counts none). Here each group
is stepped in batches of parameters holding at most BATCH_BYTES together (or one larger
tensor alone), through the same torch functional update: the arithmetic of every tensor is
unchanged (foreach ops act per tensor), the state_dict is torch's, and the scratch is one
batch. Batches of 64 MiB keep the kernel count per step small: speed stays torch's
(benchmarks/optimizers.py measures it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.optim.adam import adam

# Scratch bound per batch: one 4096 x 4096 fp32 matrix.
BATCH_BYTES = 64 * 2**20


def batches(sizes: Sequence[int], limit: int = BATCH_BYTES) -> list[list[int]]:
    """Indices of ``sizes`` (bytes) split, in order, into runs of at most ``limit`` bytes;
    a tensor larger than ``limit`` is a run of its own."""
    runs: list[list[int]] = []
    total = 0
    for index, size in enumerate(sizes):
        if not runs or total + size > limit:
            runs.append([])
            total = 0
        runs[-1].append(index)
        total += size
    return runs


def step_scratch_bound(group_sizes: Sequence[Sequence[int]], limit: int = BATCH_BYTES) -> int:
    """An upper bound of the step's scratch for groups of these tensor sizes, whatever
    their order: a batch holds at most ``limit`` bytes or one larger tensor."""
    return max((min(sum(sizes), max(limit, max(sizes))) for sizes in group_sizes if sizes),
               default=0)


class BoundedAdamW(torch.optim.AdamW):
    """torch.optim.AdamW stepped in batches of at most ``batch_bytes`` of parameters."""

    def __init__(self, params, *, batch_bytes: int = BATCH_BYTES, **options) -> None:  # noqa: ANN001
        super().__init__(params, foreach=True, **options)
        self.batch_bytes = batch_bytes

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            with_grad = [p for p in group["params"] if p.grad is not None]
            sizes = [p.numel() * p.element_size() for p in with_grad]
            for run in batches(sizes, self.batch_bytes):
                self._step_batch(group, [with_grad[index] for index in run])
        return loss

    def _step_batch(self, group: dict, params: list[torch.Tensor]) -> None:
        """torch's AdamW.step for ``params`` of ``group`` (lists as its _init_group fills
        them; state stays keyed by parameter in self.state)."""
        lists: tuple[list[torch.Tensor], ...] = ([], [], [], [], [], [])
        has_complex = self._init_group({**group, "params": params}, *lists)
        beta1, beta2 = group["betas"]
        adam(*lists, amsgrad=group["amsgrad"], has_complex=has_complex, beta1=beta1,
             beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"],
             eps=group["eps"], maximize=group["maximize"], foreach=group["foreach"],
             capturable=group["capturable"], differentiable=group["differentiable"],
             fused=group["fused"], grad_scale=getattr(self, "grad_scale", None),
             found_inf=getattr(self, "found_inf", None),
             decoupled_weight_decay=group["decoupled_weight_decay"])
