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

Categories (the project vocabulary), highest priority first -- a storage that is two
things (a weight saved for backward, say) counts as the first:

- ``weights``: storages of parameters and buffers of attached models, including
  ``Params4bit.quant_state`` / ``Int8Params.CB``/``SCB`` tensors;
- ``grads``: storages of ``.grad`` of those parameters (and of any optimizer that steps);
- ``optimizer``: storages reachable from ``optimizer.state`` (nested dicts, lists, tuples,
  tensor subclasses) and tensor values in ``param_groups``;
- ``activations``: storages saved for backward (an outermost ``saved_tensors_hooks``
  pair marks them; it returns the tensor itself and redoes autograd's in-place version
  check, which autograd skips for hooked tensors), plus storages allocated under grad
  mode while *another* saved-tensors hook is on top -- inside ``torch.utils.checkpoint``
  (including its recomputation) or ``save_on_cpu``, whose hooks shadow ours (only the
  innermost pair runs), so everything such a region allocates with grad enabled is
  taken to be activation memory: checkpointed block inputs, recomputed activations,
  offloaded copies;
- ``temporaries``: every other live storage (in-flight forward values, gradients of
  activations, optimizer scratch, evaluation under ``inference_mode``).

A storage's category can be learned after its allocation (a gradient buffer becomes
``.grad``; ``exp_avg`` is assigned into ``optimizer.state``; a fresh result is then saved
for backward). Re-classification is applied to the peak snapshot too when the storage
was already alive at the peak, so the split always describes the moment of the peak as
it is finally understood, while each new peak costs only copying five integers.

With ``budget_bytes`` set, an op whose new storages would take the live total over the
budget raises ``torch.OutOfMemoryError`` (the class CUDA raises) and its outputs are not
counted, so a caller that catches the error can retry with a smaller workload.

Not seen: memory an op uses internally and frees before returning (workspace inside one
kernel), storages created before the tracker was entered and never attached or saved,
sparse tensors, and non-CPU storages (the CUDA meter handles CUDA).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

from memfit._utils.sizes import format_bytes

CATEGORIES: tuple[str, ...] = ("weights", "grads", "optimizer", "activations", "temporaries")
# Indices into CATEGORIES; a lower index wins when a storage belongs to several.
WEIGHTS, GRADS, OPTIMIZER, ACTIVATIONS, TEMPORARIES = range(len(CATEGORIES))

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


def storages_of(tensor: torch.Tensor) -> Iterator[torch.UntypedStorage]:
    """The untyped storages holding ``tensor``'s data (several for wrapper subclasses)."""
    if is_traceable_wrapper_subclass(tensor):
        # e.g. torchao 8-bit optimizer state or DTensor: the bytes live in inner tensors.
        names, _ = tensor.__tensor_flatten__()
        for name in names:
            inner = getattr(tensor, name)
            if isinstance(inner, torch.Tensor):  # DTensor also names its device mesh here
                yield from storages_of(inner)
        return
    if tensor.layout is not torch.strided:
        return  # sparse / nested layouts have no single storage; not counted
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return  # a wrapper subclass that does not say where its data is
    yield storage


def _cpu_storages(tensor: torch.Tensor) -> tuple[torch.UntypedStorage, ...]:
    # Fast path for the common case (a plain dense tensor): no generator, no device object.
    if type(tensor) is torch.Tensor or type(tensor) is nn.Parameter:
        if tensor.is_cpu and tensor.layout is torch.strided:
            return (tensor.untyped_storage(),)
        return ()
    return tuple(s for s in storages_of(tensor) if s.device.type == "cpu")


def nested_tensors(value: Any) -> Iterator[torch.Tensor]:
    """Tensors inside nested dicts/lists/tuples (dict keys are skipped: they are params)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from nested_tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from nested_tensors(item)


def _quantization_tensors(param: torch.Tensor) -> Iterator[torch.Tensor]:
    # bitsandbytes keeps the real weight bytes beside the parameter: Params4bit.quant_state
    # (absmax, code, offset, and a nested state2 for double quantization), Int8Params.CB/SCB.
    # Read from __dict__ so we never touch properties or follow Params4bit.module.
    extra = getattr(param, "__dict__", {})
    for name in ("quant_state", "CB", "SCB"):
        value = extra.get(name)
        if isinstance(value, torch.Tensor):
            yield value
        elif value is not None and hasattr(value, "__dict__"):
            yield from _object_tensors(value)


def _object_tensors(state: object) -> Iterator[torch.Tensor]:
    for value in vars(state).values():
        if isinstance(value, torch.Tensor):
            yield value
        elif type(value) is type(state):  # QuantState.state2 is another QuantState
            yield from _object_tensors(value)


def weight_tensors(model: nn.Module) -> Iterator[torch.Tensor]:
    """Parameters (with their quantization state) and buffers of ``model``."""
    for param in model.parameters():
        yield param
        yield from _quantization_tensors(param)
    yield from model.buffers()


def grad_tensors(params: Iterable[torch.Tensor]) -> Iterator[torch.Tensor]:
    for param in params:
        if param.grad is not None:
            yield param.grad


def optimizer_params(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    for group in optimizer.param_groups:
        yield from group["params"]


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    """Tensors in ``optimizer.state`` and non-parameter tensors in ``param_groups``."""
    yield from nested_tensors(optimizer.state)
    for group in optimizer.param_groups:
        yield from nested_tensors({k: v for k, v in group.items() if k != "params"})


class _StorageRef(weakref.ref):
    """Weak reference to one counted storage, carrying what was counted for it."""

    __slots__ = ("key", "nbytes", "category", "born")
    key: int
    nbytes: int
    category: int
    born: int  # registration sequence number: alive at a peak iff born <= peak_seq


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
        self._records: dict[int, _StorageRef] = {}  # id(storage) -> ref; ids are stable
        self._bytes = [0] * len(CATEGORIES)  # live bytes per category
        self._total = 0
        self._seq = 0
        self._peak_total = 0
        self._peak_split = [0] * len(CATEGORIES)
        self._peak_seq = 0
        self._models: list[nn.Module] = []
        self._optimizers: list[torch.optim.Optimizer] = []
        # Kept as attributes so the identity check against the top hook in
        # _fresh_category compares the very objects that were pushed.
        self._pack_hook = self._on_pack
        self._unpack_hook = _unpack
        self._saved_hooks: torch.autograd.graph.saved_tensors_hooks | None = None
        self._saved_this_entry: list[weakref.ref[_Saved]] = []
        self._optimizer_hook: Any = None  # RemovableHandle while entered
        self._entered = False

    # ---- what the numbers are --------------------------------------------------------
    @property
    def live_bytes(self) -> int:
        return self._total

    @property
    def peak_bytes(self) -> int:
        return self._peak_total

    def live_by_category(self) -> dict[str, int]:
        return dict(zip(CATEGORIES, self._bytes, strict=True))

    def peak_by_category(self) -> dict[str, int]:
        return dict(zip(CATEGORIES, self._peak_split, strict=True))

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
        if not self._bytes[ACTIVATIONS]:
            return
        for ref in self._records.values():
            if ref.category == ACTIVATIONS:
                ref.category = TEMPORARIES
                self._bytes[ACTIVATIONS] -= ref.nbytes
                self._bytes[TEMPORARIES] += ref.nbytes

    def reset_peak(self) -> None:
        self._peak_total = self._total
        self._peak_split = self._bytes.copy()
        self._peak_seq = self._seq

    def check_budget(self) -> None:
        """Raise ``torch.OutOfMemoryError`` if what is live already exceeds the budget."""
        if self.budget_bytes is not None and self._total > self.budget_bytes:
            raise torch.OutOfMemoryError(
                f"simulated device budget exceeded before the step: "
                f"{_format_bytes(self._total)} live, budget {_format_bytes(self.budget_bytes)}"
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
            self._optimizer_hook.remove()
            hooks, self._saved_hooks = self._saved_hooks, None
            if hooks is not None:
                hooks.__exit__()

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
        grown: list[tuple[_StorageRef, int]] = []
        extra = 0
        for tensor in outputs:
            if not isinstance(tensor, torch.Tensor):
                continue
            for storage in _cpu_storages(tensor):
                ref = self._records.get(id(storage))
                if ref is not None:
                    if may_resize and storage.nbytes() != ref.nbytes:
                        grown.append((ref, storage.nbytes()))
                        extra += storage.nbytes() - ref.nbytes
                    continue
                if new and any(s is storage for s, _ in new):
                    continue  # two outputs viewing one new storage (split, unbind...)
                nbytes = storage.nbytes()
                if nbytes:
                    new.append((storage, nbytes))
                    extra += nbytes
        if extra > 0 and self.budget_bytes is not None and self._total + extra > self.budget_bytes:
            for ref, nbytes in grown:
                # An out=/resize_ op has already grown the storage in place: count the truth.
                self._resize(ref, nbytes)
            raise torch.OutOfMemoryError(
                f"simulated device budget exceeded by {func}: it needs {_format_bytes(extra)} "
                f"more with {_format_bytes(self._total)} live, "
                f"budget {_format_bytes(self.budget_bytes)}"
            )
        for ref, nbytes in grown:
            self._resize(ref, nbytes)
        if new:
            category = self._fresh_category()
            for storage, nbytes in new:
                self._add(storage, nbytes, category)
        self._update_peak()

    def _fresh_category(self) -> int:
        if not torch.is_grad_enabled():
            return TEMPORARIES
        top = torch._C._autograd._top_saved_tensors_default_hooks(False)
        if top is not None and top[0] is not self._pack_hook:
            # Inside checkpoint / save_on_cpu: their hooks hide what is saved from us.
            return ACTIVATIONS
        return TEMPORARIES

    def _add(self, storage: torch.UntypedStorage, nbytes: int, category: int) -> None:
        ref = _StorageRef(storage, self._on_free)
        ref.key = id(storage)
        ref.nbytes = nbytes
        ref.category = category
        self._seq += 1
        ref.born = self._seq
        self._records[ref.key] = ref
        self._bytes[category] += nbytes
        self._total += nbytes

    def _resize(self, ref: _StorageRef, nbytes: int) -> None:
        self._bytes[ref.category] += nbytes - ref.nbytes
        self._total += nbytes - ref.nbytes
        ref.nbytes = nbytes

    def _on_free(self, ref: _StorageRef) -> None:
        # Runs when the StorageImpl dies (its Python object is preserved until then), so
        # the id cannot have been reused yet.
        if self._records.get(ref.key) is ref:
            del self._records[ref.key]
            self._bytes[ref.category] -= ref.nbytes
            self._total -= ref.nbytes

    def _update_peak(self) -> None:
        if self._total > self._peak_total:
            self._peak_total = self._total
            self._peak_split = self._bytes.copy()
            self._peak_seq = self._seq

    def _promote(self, ref: _StorageRef, category: int) -> None:
        old = ref.category
        if category >= old:
            return
        ref.category = category
        self._bytes[old] -= ref.nbytes
        self._bytes[category] += ref.nbytes
        if ref.born <= self._peak_seq:
            # It was alive at the peak, in the role we now know it had.
            self._peak_split[old] -= ref.nbytes
            self._peak_split[category] += ref.nbytes

    def _classify(self, tensors: Iterable[torch.Tensor], category: int) -> None:
        for tensor in tensors:
            for storage in _cpu_storages(tensor):
                ref = self._records.get(id(storage))
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
        self._update_peak()

    def _on_pack(self, tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
        for storage in _cpu_storages(tensor):
            ref = self._records.get(id(storage))
            if ref is not None:
                self._promote(ref, ACTIVATIONS)
            elif storage.nbytes():
                # Existed before we could see it (the input batch): count it from now on.
                self._add(storage, storage.nbytes(), ACTIVATIONS)
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
