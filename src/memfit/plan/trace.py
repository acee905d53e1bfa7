"""Activations and temporaries, measured by running one training micro-batch on fake tensors.

The model's parameters are ``FakeTensor``s on "cpu" (shape, dtype and device, no data), so
the forward and backward below execute every real op — autocast casts, checkpoint
recomputation, the attention kernel CPU and CUDA would pick (flash-style: output +
logsumexp, no seq x seq matrix) — while allocating nothing. ``LiveBytes``, a
``TorchDispatchMode`` stacked on top of the fake mode, counts the live storages exactly as
``monitor.tensor_tracker.TensorTracker`` counts real ones, with ``memfit.accounting``'s
categories and rules (what a weight, a grad, an activation is; which role wins), so plan
and measurement speak one vocabulary. Nothing here is optimizer state: ``optimizer`` stays 0.

Activation offload is emulated, not run (``save_on_cpu`` would allocate real host
memory): every tensor saved for backward moves to ``host`` bytes and comes back as a new
device tensor when backward unpacks it — what ``save_on_cpu`` does, parameters included.

Data-dependent selections (``x[mask]``, ``nonzero``) are taken to keep every element:
every position carries a label, as with packed text.
"""

from __future__ import annotations

import contextlib
import weakref
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from memfit.accounting import (
    CATEGORIES,
    GRADS,
    SAVED_FOR_BACKWARD,
    WEIGHTS,
    LiveStorages,
    fresh_category,
    weight_tensors,
)
from memfit.plan.work_count import WorkCount
from memfit.techniques.work import Work

_SELECTIONS = {torch.ops.aten.nonzero.default, torch.ops.aten.index.Tensor,
               torch.ops.aten.masked_select.default}


@dataclass(frozen=True)
class TraceResult:
    """Bytes of one micro-batch's forward + backward, at three moments.

    ``peak``: the split at the highest live total. ``peak_without_grads``: the split at
    the highest total of everything but grads — the peak when grads already exist from an
    earlier micro-batch (add them all) or are consumed as they appear (layer-wise: add one).
    ``backward_without_grads``: the same among the moments of backward (once a first grad
    exists): where FSDP2, which divides the grads, peaks when the loss's own tensors are
    what made the forward peak.
    """

    peak: dict[str, int]
    peak_without_grads: dict[str, int]
    backward_without_grads: dict[str, int]
    host_peak_bytes: int  # activations held in host memory by offload
    work: Work  # what the forward and backward ask of the device (work_count.py)


class LiveBytes(TorchDispatchMode):
    """Counts live (fake) storages by category; see the module docstring.

    A storage's role can become known only after it was counted: the gradient of a weight
    is computed as a temporary and becomes a grad when it is accumulated; a tensor becomes
    an activation when it is saved for backward. So the bytes of every moment (one per new
    storage) are kept, a promotion re-labels the storage at every moment it was alive, and
    both peaks are picked at the end, from the corrected timeline. Picking the "without
    grads" peak as the trace runs would be wrong: the moment a weight's gradient is born
    has the most non-grad bytes so far, and once that gradient turns out to be a grad that
    moment is no longer the peak, while the real one (end of forward: activations alive)
    was already passed over.
    """

    def __init__(self) -> None:
        super().__init__()
        self._live = LiveStorages()  # CountedStorage.born: the moment it was counted
        self._timeline = array("q")  # len(CATEGORIES) values per moment
        self._promotions: list[tuple[int, int, int, int, int]] = []  # first, last, from, to, bytes
        self.host_bytes = 0
        self.host_peak_bytes = 0
        self.work = WorkCount()
        self.pack_hook = self._pack

    # ---- results ----------------------------------------------------------------------
    def result(self) -> TraceResult:
        width = len(CATEGORIES)
        moments = len(self._timeline) // width
        if not moments:
            empty = dict.fromkeys(CATEGORIES, 0)
            return TraceResult(empty, dict(empty), dict(empty), self.host_peak_bytes,
                               self.work.result())
        # Promotions as a difference array over moments, then a running sum.
        changes: dict[int, list[int]] = {}
        for first, last, old, new, nbytes in self._promotions:
            for moment, sign in ((first, 1), (last + 1, -1)):
                delta = changes.setdefault(moment, [0] * width)
                delta[old] -= sign * nbytes
                delta[new] += sign * nbytes
        correction = [0] * width
        best_all = best_nograd = None
        best_backward = [0] * width
        for moment in range(moments):
            delta = changes.get(moment)
            if delta is not None:
                correction = [c + d for c, d in zip(correction, delta, strict=True)]
            values = [v + c for v, c in zip(self._timeline[moment * width:(moment + 1) * width],
                                            correction, strict=True)]
            total = sum(values)
            if best_all is None or total > sum(best_all):
                best_all = values
            without = total - values[GRADS]
            if best_nograd is None or without > sum(best_nograd) - best_nograd[GRADS]:
                best_nograd = values
            if values[GRADS] and without > sum(best_backward) - best_backward[GRADS]:
                best_backward = values
        return TraceResult(*(dict(zip(CATEGORIES, split, strict=True))
                             for split in (best_all, best_nograd, best_backward)),
                           self.host_peak_bytes, self.work.result())

    # ---- registration -----------------------------------------------------------------
    def add(self, tensor: torch.Tensor, category: int) -> None:
        """Count ``tensor``'s storage (if new) or move it to a higher-priority category."""
        storage = tensor.untyped_storage()
        live = self._live
        record = live.records.get(id(storage))
        if record is None:
            if storage.nbytes():
                live.count(storage, storage.nbytes(), category, born=self._now() + 1)
                self._moment()  # the moment it was born at
            return
        old = record.category
        if live.promote(record, category):
            # In the role now known at every moment it was alive (it still is).
            self._promotions.append((record.born, self._now(), old, category, record.nbytes))
            self._moment()  # the split changed (e.g. out of grads): a moment of its own

    def _now(self) -> int:
        """The index of the last moment recorded."""
        return len(self._timeline) // len(CATEGORIES) - 1

    def _moment(self) -> None:
        """Record the bytes now (peaks happen when something is added)."""
        self._timeline.extend(self._live.bytes)

    # ---- hooks ------------------------------------------------------------------------
    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        self.add(tensor, SAVED_FOR_BACKWARD)
        return tensor

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func in _SELECTIONS and _selects_by_mask(func, args):
            out = _keep_everything(func, args)
        else:
            out = func(*args, **kwargs)
        self.work.count(func, args, kwargs, out)
        records, category = self._live.records, None
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if (isinstance(tensor, torch.Tensor)
                    and id(tensor.untyped_storage()) not in records):
                if category is None:  # asked once per op, and only when it allocated
                    category = fresh_category(self.pack_hook)
                self.add(tensor, category)
        return out


def _selects_by_mask(func: Any, args: tuple) -> bool:
    if func is torch.ops.aten.index.Tensor:
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])
    return True


def _keep_everything(func: Any, args: tuple) -> torch.Tensor:
    """Output of a boolean selection whose mask is all true (fake: shapes only)."""
    source = args[0]
    if func is torch.ops.aten.nonzero.default:
        return torch.empty(source.numel(), source.dim(), dtype=torch.long)
    if func is torch.ops.aten.masked_select.default:
        return torch.empty(args[1].numel(), dtype=source.dtype)
    (mask,) = [i for i in args[1] if i is not None]
    return torch.empty((mask.numel(), *source.shape[mask.dim():]), dtype=source.dtype)


class _HostCopy:
    """What offload keeps per saved tensor: its bytes in host memory and how to rebuild it."""

    __slots__ = ("shape", "stride", "dtype", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.shape, self.stride, self.dtype = tensor.shape, tensor.stride(), tensor.dtype


def _offload_hooks(live: LiveBytes) -> torch.autograd.graph.saved_tensors_hooks:
    def pack(tensor: torch.Tensor) -> _HostCopy:
        copy = _HostCopy(tensor)
        # The copy holds the tensor's elements, not its storage's: a chunk of the chunked
        # loss saves a [chunk, hidden] view of the [tokens, hidden] states (counting the
        # storage once per chunk made 50 of the 54 GiB host bytes of an 8B model at 81,920
        # tokens).
        nbytes = tensor.numel() * tensor.element_size()
        live.host_bytes += nbytes
        live.work.host_copy += nbytes
        live.host_peak_bytes = max(live.host_peak_bytes, live.host_bytes)
        weakref.finalize(copy, _release, live, nbytes)
        return copy

    def unpack(copy: _HostCopy) -> torch.Tensor:
        return torch.empty_strided(copy.shape, copy.stride, dtype=copy.dtype)

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def _release(live: LiveBytes, nbytes: int) -> None:
    live.host_bytes -= nbytes


def to_fake(model: nn.Module, mode: FakeTensorMode) -> nn.Module:
    """Replace every meta parameter/buffer by a fake CPU tensor, in place (ties kept)."""
    converted: dict[int, torch.Tensor] = {}

    def fake(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in converted:
            with mode:
                new = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype,
                                          device="cpu")
            if isinstance(tensor, nn.Parameter):
                new = nn.Parameter(new, requires_grad=tensor.requires_grad)
            converted[id(tensor)] = new
        return converted[id(tensor)]

    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, tensor in table.items():
                if tensor is not None:
                    table[name] = fake(tensor)
    return model


def trace_micro_batch(
    model: nn.Module,
    make_batch: Callable[[], dict[str, Any]],
    loss_sum: Callable[[nn.Module, dict[str, Any]], torch.Tensor],
    autocast_dtype: torch.dtype | None,
    activation_offload: bool,
) -> TraceResult:
    """Forward + backward of one micro-batch on ``model`` (meta parameters; converted to
    fake in place). ``make_batch`` runs under the fake mode and builds the inputs."""
    mode = _fake_mode()
    to_fake(model, mode)
    live = LiveBytes()
    for tensor in weight_tensors(model):
        live.add(tensor, WEIGHTS)
    handles = [p.register_post_accumulate_grad_hook(lambda p: live.add(p.grad, GRADS))
               for p in model.parameters() if p.requires_grad]
    offload = _offload_hooks(live) if activation_offload else contextlib.nullcontext()
    autocast = (torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype
                else contextlib.nullcontext())
    try:
        with mode, live, torch.autograd.graph.saved_tensors_hooks(live.pack_hook, _identity):
            batch = make_batch()
            with autocast, offload:
                loss = loss_sum(model, batch)
            # Training backpropagates the sum over the step's items (training/step.py):
            # the 0-dim sum and quotient both live through backward.
            mean = loss / 1
            mean.backward()
            del loss, mean, batch
    finally:
        for handle in handles:
            handle.remove()
    return live.result()


_MODES: list[FakeTensorMode] = []


def _fake_mode() -> FakeTensorMode:
    """One fake mode for every trace: its cache of op output metadata carries over, which
    makes the many traces of one plan several times faster."""
    if not _MODES:
        _MODES.append(FakeTensorMode())
    return _MODES[0]


def _identity(tensor: torch.Tensor) -> torch.Tensor:
    return tensor
