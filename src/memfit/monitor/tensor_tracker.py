"""Exact CPU memory accounting: live tensor storages, by category, with an optional budget.

``TensorTracker`` is a ``TorchDispatchMode``. While it is entered, every aten op that
returns a tensor on a storage it has not seen registers that storage (its ``nbytes``,
counted once however many views share it) and a weak reference whose callback subtracts
it again when the storage dies. What it measures is therefore the bytes of live tensor
storages -- exactly what ``plan`` predicts -- not RSS, allocator caching or fragmentation.

Storages that existed before the tracker was entered are counted once they are known:
``scan()`` walks the attached models and optimizers (parameters, buffers, 4-bit and 8-bit
quantization state, ``.grad``, ``optimizer.state``), and a tensor saved for backward is
registered when autograd packs it (the input batch is typically found that way).

What each storage counts as -- ``weights``, ``grads``, ``optimizer``, ``activations``,
``temporaries`` -- and which role wins are ``memfit.accounting``'s rules, shared with the
planner's trace. Here, a tensor saved for backward is seen by an outermost
``saved_tensors_hooks`` pair that returns the tensor itself and redoes autograd's in-place
version check (which autograd skips for hooked tensors). A role learned late (a gradient
buffer becomes ``.grad``, ``exp_avg`` is assigned into ``optimizer.state``) is applied to
the peak snapshot too when the storage was already alive at the peak, so the split always
describes the moment of the peak as it is finally understood, while each new peak costs
only copying five integers.

Host memory is a pool of its own: a storage ``memfit.accounting.HOST`` says memfit keeps
on the host (offloaded activations, optimizer offload's masters, grads and state, FSDP2's
offloaded shards) is counted in ``host_live_bytes`` / ``host_peak_bytes`` and never in the
device's totals, categories, peak or budget, even though on a CPU device it is a CPU
storage like the others. While nothing is host (``_hosting``: no offload in the run) the
pool costs one check per op that creates storages; otherwise also a host lookup per storage.

With ``budget_bytes`` set, an op whose new storages would take the live total over the
budget raises ``torch.OutOfMemoryError`` (the class CUDA raises) and its outputs are not
counted, so a caller that catches the error can retry with a smaller workload.

Not seen: memory an op uses internally and frees before returning (workspace inside one
kernel), storages created before the tracker was entered and never attached or saved,
sparse tensors, and non-CPU storages (the CUDA meter handles CUDA; the host bytes of a CUDA
run are CPU storages this tracker is not entered around).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._python_dispatch import TorchDispatchMode

from memfit._utils.sizes import format_bytes
from memfit.accounting import (
    ACTIVATIONS,
    CATEGORIES,
    GRADS,
    HOST,
    OPTIMIZER,
    SAVED_FOR_BACKWARD,
    TEMPORARIES,
    WEIGHTS,
    CountedStorage,
    LiveStorages,
    fresh_category,
    grad_tensors,
    optimizer_params,
    optimizer_state_tensors,
    storages_of,
    weight_tensors,
)

# How an op's outputs relate to storages, decided once per OpOverload from its schema.
_SKIP = 0  # no tensor outputs, or every output is a view/in-place result of an input
_FRESH = 1  # outputs may be new storages
_MAY_RESIZE = 2  # outputs alias inputs, but the op may grow their storage (out=, resize_)
_RESIZING_OPS = frozenset({"resize_", "resize_as_", "set_", "_resize_output_"})


def _op_kind(func: torch._ops.OpOverload) -> int:
    schema = func._schema
    if func.__name__.startswith("lift_fresh"):
        # torch.tensor(...) / from_numpy build the tensor outside the dispatcher and only
        # pass it through this (aliasing) op: the first place we can see the new storage.
        return _FRESH
    tensor_returns = [r for r in schema.returns if "Tensor" in str(r.type)]
    if not tensor_returns:
        return _SKIP
    if any(r.alias_info is None for r in tensor_returns):
        return _FRESH
    writes_out_arg = any(
        a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
        for a in schema.arguments
    )
    if writes_out_arg or func._schema.name.split("::")[-1] in _RESIZING_OPS:
        return _MAY_RESIZE
    return _SKIP


_OP_KINDS: dict[torch._ops.OpOverload, int] = {}


def _cpu_storages(tensor: torch.Tensor) -> tuple[torch.UntypedStorage, ...]:
    # Fast path for the common case (a plain dense tensor): no generator, no device object.
    if type(tensor) is torch.Tensor or type(tensor) is nn.Parameter:
        if tensor.is_cpu and tensor.layout is torch.strided:
            return (tensor.untyped_storage(),)
        return ()
    return tuple(s for s in storages_of(tensor) if s.device.type == "cpu")


def _format_bytes(num_bytes: int) -> str:
    return f"{format_bytes(num_bytes)} ({num_bytes} bytes)"


class TensorTracker(TorchDispatchMode):
    """Counts live CPU tensor storages by category; optionally enforces a byte budget.

    Enter it (``with tracker:``) around the code to measure; it can be entered many times
    but not nested. ``attach`` says what counts as weights/grads/optimizer; ``scan`` walks
    those objects; ``reset_peak`` starts a new peak window at the current live total.
    """

    def __init__(self, budget_bytes: int | None = None) -> None:
        super().__init__()
        self.budget_bytes = budget_bytes
        self._live = LiveStorages()
        self._host = LiveStorages()  # the host pool: never in _live too
        self._host_peak = 0
        self._seq = 0  # storages counted so far: CountedStorage.born
        self._peak_total = 0
        self._peak_split = [0] * len(CATEGORIES)
        self._peak_seq = 0
        self._models: list[nn.Module] = []
        self._optimizers: list[torch.optim.Optimizer] = []
        # Kept as attributes so the identity check against the top hook in
        # fresh_category compares the very objects that were pushed.
        self._pack_hook = self._on_pack
        self._unpack_hook = _unpack
        self._saved_hooks: torch.autograd.graph.saved_tensors_hooks | None = None
        self._saved_this_entry: list[weakref.ref[_Saved]] = []
        self._optimizer_hook: Any = None  # RemovableHandle while entered
        self._entered = False

    # ---- what the numbers are --------------------------------------------------------
    @property
    def live_bytes(self) -> int:
        return self._live.total

    @property
    def peak_bytes(self) -> int:
        return self._peak_total

    def live_by_category(self) -> dict[str, int]:
        return dict(zip(CATEGORIES, self._live.bytes, strict=True))

    def peak_by_category(self) -> dict[str, int]:
        return dict(zip(CATEGORIES, self._peak_split, strict=True))

    @property
    def host_live_bytes(self) -> int:
        return self._host.total

    def host_live_by_category(self) -> dict[str, int]:
        """The host pool's live bytes by the role each storage has (state, master copies as
        weights, offloaded activations...)."""
        return dict(zip(CATEGORIES, self._host.bytes, strict=True))

    @property
    def host_peak_bytes(self) -> int:
        """The most host-pool bytes alive at once since ``reset_peak``."""
        return self._host_peak

    # ---- what to classify ------------------------------------------------------------
    def attach(
        self, model: nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None
    ) -> None:
        """Classify what ``model`` / ``optimizer`` hold (replacing earlier ones); count now."""
        # Replacing, not adding: a rebuilt optimizer's predecessor must not be kept alive.
        if model is not None:
            self._models = [model]
        if optimizer is not None:
            self._optimizers = [optimizer]
        self.scan()

    def scan(self, include_weights: bool = True) -> None:
        """Register and classify everything the attached objects hold right now.

        ``include_weights=False`` skips parameters and buffers (they rarely change within
        a step) to halve the cost of the walk at the end of each step.
        """
        for model in self._models if include_weights else ():
            self._classify(weight_tensors(model), WEIGHTS)
        for optimizer in self._optimizers:
            self._classify_optimizer(optimizer)
        for model in self._models:
            self._classify(grad_tensors(model.parameters()), GRADS)
        self._update_peak()

    def forget_activations(self) -> None:
        """Demote activations left from an earlier step (a held ``loss``) to temporaries."""
        live = self._live
        if not live.bytes[ACTIVATIONS]:
            return
        for ref in live.records.values():
            if ref.category == ACTIVATIONS:
                live.relabel(ref, TEMPORARIES)

    def reset_peak(self) -> None:
        self._host_peak = self._host.total
        self._peak_total = self._live.total
        self._peak_split = self._live.bytes.copy()
        self._peak_seq = self._seq

    def check_budget(self) -> None:
        """Raise ``torch.OutOfMemoryError`` if what is live already exceeds the budget."""
        live_bytes = self._live.total
        if self.budget_bytes is not None and live_bytes > self.budget_bytes:
            raise torch.OutOfMemoryError(
                f"simulated device budget exceeded before the step: "
                f"{_format_bytes(live_bytes)} live, budget {_format_bytes(self.budget_bytes)}"
            )

    # ---- entering --------------------------------------------------------------------
    def __enter__(self) -> TensorTracker:
        if self._entered:
            raise RuntimeError("TensorTracker is already entered; it cannot be nested")
        # torch.func transforms disable saved-tensor hooks; then we only miss the marking.
        if torch._C._autograd._saved_tensors_hooks_is_enabled():
            self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(
                self._pack_hook, self._unpack_hook
            )
            self._saved_hooks.__enter__()
        # Global, so optimizers stepped inside a layer-wise (in-backward) wrapper count too.
        self._optimizer_hook = register_optimizer_step_post_hook(self._after_optimizer_step)
        self._watch_storage_resizes()
        self._entered = True
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        saved, self._saved_this_entry = self._saved_this_entry, []
        if exc[0] is not None:  # aborted (e.g. OOM): its graph will never run backward
            for reference in saved:
                holder = reference()
                if holder is not None:
                    holder.tensor = None
        try:
            super().__exit__(*exc)
        finally:
            self._entered = False
            torch.UntypedStorage.resize_ = self._resize_outside_dispatch
            self._optimizer_hook.remove()
            hooks, self._saved_hooks = self._saved_hooks, None
            if hooks is not None:
                hooks.__exit__()

    def _watch_storage_resizes(self) -> None:
        """Count ``UntypedStorage.resize_`` while entered. It is not an operator, so the
        dispatcher never shows it, and FSDP2 frees each unit's all-gathered weights with
        it after forward (and allocates them again before backward): a storage only the
        dispatcher saw would otherwise stay counted at its full size until it dies."""
        resize = self._resize_outside_dispatch = torch.UntypedStorage.resize_

        def counted_resize(storage: torch.UntypedStorage, size: int):
            result = resize(storage, size)
            if storage.device.type == "cpu":
                self._storage_resized(storage)
            return result

        torch.UntypedStorage.resize_ = counted_resize

    def _hosting(self) -> bool:
        """Whether host bookkeeping can matter now: a host allocation is under way, some
        storage is tagged host, or the pool counts one. False for every run without offload
        (nothing calls mark_host or host_allocations), which then skips the host lookups."""
        return bool(HOST.allocating or HOST.ids or self._host.records)

    def _storage_resized(self, storage: torch.UntypedStorage) -> None:
        nbytes = storage.nbytes()
        ledger, ref = self._find(storage)
        if ref is not None:
            ledger.resize(ref, nbytes)
        elif nbytes:
            self._add(storage, nbytes, fresh_category(self._pack_hook))
        self._update_peak()

    # ---- bookkeeping -----------------------------------------------------------------
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # TorchDispatchMode otherwise wraps __torch_dispatch__ in torch._disable_dynamo,
        # which costs ~2 us per op; this mode is never meant to run under torch.compile.
        return False

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        kind = _OP_KINDS.get(func)
        if kind is None:
            kind = _OP_KINDS[func] = _op_kind(func)
        if kind != _SKIP:
            self._account(func, out, kind == _MAY_RESIZE)
        return out

    def _account(self, func: torch._ops.OpOverload, out: Any, may_resize: bool) -> None:
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        new: list[tuple[torch.UntypedStorage, int]] = []
        grown: list[tuple[CountedStorage, int]] = []
        extra = 0
        live, host = self._live, self._host
        records = live.records
        hosting = self._hosting()
        for tensor in outputs:
            if not isinstance(tensor, torch.Tensor):
                continue
            for storage in _cpu_storages(tensor):
                ref = records.get(id(storage))
                if ref is not None:
                    if may_resize and storage.nbytes() != ref.nbytes:
                        grown.append((ref, storage.nbytes()))
                        extra += storage.nbytes() - ref.nbytes
                    continue
                if hosting:
                    host_ref = host.records.get(id(storage))
                    if host_ref is not None:
                        if may_resize and storage.nbytes() != host_ref.nbytes:
                            self._resize_host(host_ref, storage.nbytes())
                        continue
                    if HOST.allocating or id(storage) in HOST.ids:
                        # An offload copying into host memory: not the device's, nor its
                        # budget's.
                        if storage.nbytes():
                            self._add(storage, storage.nbytes(),
                                      fresh_category(self._pack_hook))
                        continue
                if new and any(s is storage for s, _ in new):
                    continue  # two outputs viewing one new storage (split, unbind...)
                nbytes = storage.nbytes()
                if nbytes:
                    new.append((storage, nbytes))
                    extra += nbytes
        if extra > 0 and self.budget_bytes is not None and live.total + extra > self.budget_bytes:
            for ref, nbytes in grown:
                # An out=/resize_ op has already grown the storage in place: count the truth.
                live.resize(ref, nbytes)
            raise torch.OutOfMemoryError(
                f"simulated device budget exceeded by {func}: it needs {_format_bytes(extra)} "
                f"more with {_format_bytes(live.total)} live, "
                f"budget {_format_bytes(self.budget_bytes)}"
            )
        for ref, nbytes in grown:
            live.resize(ref, nbytes)
        if new:
            category = fresh_category(self._pack_hook)
            for storage, nbytes in new:
                self._seq += 1
                live.count(storage, nbytes, category, self._seq)
        if live.total > self._peak_total:  # _update_peak, inlined: this runs for every op
            self._peak_total = live.total
            self._peak_split = live.bytes.copy()
            self._peak_seq = self._seq

    def _add(self, storage: torch.UntypedStorage, nbytes: int, category: int) -> None:
        """Count a storage seen for the first time, in the host pool if it is a host one."""
        self._seq += 1
        if HOST.allocating or (HOST.ids and id(storage) in HOST.ids):
            self._host.count(storage, nbytes, category, self._seq)
            self._host_peak = max(self._host_peak, self._host.total)
        else:
            self._live.count(storage, nbytes, category, self._seq)

    def _find(self, storage: torch.UntypedStorage) -> tuple[LiveStorages, CountedStorage | None]:
        """The ledger counting ``storage`` (device or host) and its record (None: neither)."""
        key = id(storage)
        ref = self._live.records.get(key)
        if ref is not None or not self._host.records:
            return self._live, ref
        return self._host, self._host.records.get(key)

    def _resize_host(self, ref: CountedStorage, nbytes: int) -> None:
        self._host.resize(ref, nbytes)
        self._host_peak = max(self._host_peak, self._host.total)

    def _move_to_host(self, ref: CountedStorage, storage: torch.UntypedStorage) -> None:
        """A storage counted on the device before it was tagged as host (tagged late, e.g.
        by a caller's mark_host after the tracker saw it): host from now on. The device
        peak already taken is left as it was."""
        self._live.discount(ref)
        self._host.count(storage, ref.nbytes, ref.category, ref.born)
        self._host_peak = max(self._host_peak, self._host.total)

    def _update_peak(self) -> None:
        live = self._live
        if live.total > self._peak_total:
            self._peak_total = live.total
            self._peak_split = live.bytes.copy()
            self._peak_seq = self._seq

    def _promote(self, ref: CountedStorage, category: int) -> None:
        old = ref.category
        if self._host.records and self._live.records.get(ref.key) is not ref:
            # A host storage: no device peak.
            self._host.promote(ref, category)
            return
        if not self._live.promote(ref, category):
            return
        if ref.born <= self._peak_seq:
            # It was alive at the peak, in the role we now know it had.
            self._peak_split[old] -= ref.nbytes
            self._peak_split[category] += ref.nbytes

    def _classify(self, tensors: Iterable[torch.Tensor], category: int) -> None:
        live = self._live
        tagged = HOST.ids
        for tensor in tensors:
            for storage in _cpu_storages(tensor):
                ledger, ref = self._find(storage)
                if ref is not None and ledger is live and tagged and id(storage) in tagged:
                    self._move_to_host(ref, storage)
                    ledger, ref = self._find(storage)
                if ref is not None:
                    self._promote(ref, category)
                elif storage.nbytes():
                    self._add(storage, storage.nbytes(), category)

    def _classify_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self._classify(optimizer_params(optimizer), WEIGHTS)
        self._classify(optimizer_state_tensors(optimizer), OPTIMIZER)
        self._classify(grad_tensors(optimizer_params(optimizer)), GRADS)

    def _after_optimizer_step(
        self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        # The state an optimizer creates on its first step (and the grads it consumed) are
        # only recognisable once the step has stored them.
        self._classify_optimizer(optimizer)
        if self._hosting() and any(optimizer is attached for attached in self._optimizers):
            # An optimizer stepping host copies (optimizer offload, whose copies are tagged
            # host) consumed the model's own grads only through copies: those are the
            # device's grads. Without offload the optimizer's own grads are the model's.
            for model in self._models:
                self._classify(grad_tensors(model.parameters()), GRADS)
        self._update_peak()

    def _on_pack(self, tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
        for storage in _cpu_storages(tensor):
            _, ref = self._find(storage)
            if ref is not None:
                self._promote(ref, SAVED_FOR_BACKWARD)
            elif storage.nbytes():
                # Existed before we could see it (the input batch): count it from now on.
                self._add(storage, storage.nbytes(), SAVED_FOR_BACKWARD)
                self._update_peak()
        # Autograd skips its version check for tensors packed by hooks; keep it here.
        saved = _Saved(tensor, tensor._version)
        # Weak: holding the holder would keep activations alive after backward freed them.
        self._saved_this_entry.append(weakref.ref(saved))
        return saved


class _Saved:
    """What the pack hook hands autograd: the tensor and its version at save time.

    A node that saves its own output through a hook holds a strong reference to it, and
    the output holds the node (grad_fn): a cycle through C++ that Python's collector cannot
    see. Backward frees it; a step aborted before backward (out of memory) would leak every
    activation. The tracker therefore drops ``tensor`` from the holders of an aborted step.
    """

    __slots__ = ("tensor", "version", "__weakref__")

    def __init__(self, tensor: torch.Tensor, version: int) -> None:
        self.tensor: torch.Tensor | None = tensor
        self.version = version


def _unpack(saved: _Saved) -> torch.Tensor:
    tensor, version = saved.tensor, saved.version
    if tensor is None:
        raise RuntimeError("this graph's saved tensors were released when its step failed")
    if tensor._version != version:
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified by an "
            f"inplace operation: [{tensor.type()} {list(tensor.shape)}] is at version "
            f"{tensor._version}; expected version {version} instead"
        )
    return tensor
