"""What each byte of live tensor memory is for: the categories and the rules that sort a
storage into one, shared by ``monitor.tensor_tracker`` (real CPU storages, measured while
training) and ``plan.trace`` (fake storages, while tracing one micro-batch for the planner),
so that plan and measurement split bytes the same way.

Bytes are those of distinct live storages: a storage is counted once however many views
share it, from when it is first seen until it dies (``LiveStorages``).

Categories (the project vocabulary), highest priority first -- a storage that is two
things (a weight saved for backward, say) counts as the first (``outranks``):

- ``weights``: storages of parameters and buffers (``weight_tensors``), including
  bitsandbytes' ``Params4bit.quant_state`` / ``Int8Params.CB``/``SCB`` tensors;
- ``grads``: storages of the ``.grad`` of parameters (``grad_tensors``);
- ``optimizer``: storages reachable from ``optimizer.state`` (nested dicts, lists, tuples,
  tensor subclasses) and tensor values in ``param_groups`` (``optimizer_state_tensors``);
- ``activations``: storages saved for backward (``SAVED_FOR_BACKWARD``), plus storages
  allocated with grad enabled while another saved-tensors hook hides the saving from the
  counter (``fresh_category``): inside ``torch.utils.checkpoint`` (and its recomputation)
  or activation offload, everything allocated with grad enabled is activation memory --
  checkpointed block inputs, recomputed activations, offloaded copies;
- ``temporaries``: every other live storage (in-flight forward values, gradients of
  activations, optimizer scratch, evaluation under ``inference_mode``).

A storage's category can be learned after it was counted (a gradient buffer becomes
``.grad``; ``exp_avg`` is stored into ``optimizer.state``; a fresh result is then saved for
backward): the counter then moves it up (``LiveStorages.promote``), never down.

Host memory is a pool of its own (``HOST``): storages memfit puts in host memory on purpose
(offloaded activations, the optimizer state and master copies of optimizer offload, FSDP2's
offloaded shards) are tagged there, by ``mark_host`` or by being allocated inside
``host_allocations()``, and the tracker counts them apart from the device even when the
device is the CPU, so an offload's saving is measured rather than assumed.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

CATEGORIES: tuple[str, ...] = ("weights", "grads", "optimizer", "activations", "temporaries")
# Indices into CATEGORIES, in priority order: a lower index wins (see outranks).
WEIGHTS, GRADS, OPTIMIZER, ACTIVATIONS, TEMPORARIES = range(len(CATEGORIES))
# The category of a storage autograd packs for backward (a saved-tensors pack hook sees it).
SAVED_FOR_BACKWARD = ACTIVATIONS


def outranks(category: int, current: int) -> bool:
    """Whether a storage counted as ``current`` is ``category`` once it is known to be both."""
    return category < current


def fresh_category(own_pack_hook: Callable[[torch.Tensor], Any]) -> int:
    """The category of storages an op allocates now, before any other role is known.

    ``own_pack_hook`` is the counter's saved-tensors pack hook. When another hook is on
    top (checkpoint, save_on_cpu, offload), only that innermost pair runs, so what is saved
    for backward is hidden from the counter: everything allocated with grad enabled there
    is taken to be an activation.
    """
    if not torch.is_grad_enabled():
        return TEMPORARIES
    top = torch._C._autograd._top_saved_tensors_default_hooks(False)
    if top is not None and top[0] is not own_pack_hook:
        return ACTIVATIONS
    return TEMPORARIES


# ---- which tensors have which role --------------------------------------------------------
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
    """Parameters (with their quantization state) and buffers of ``model``: ``weights``."""
    for param in model.parameters():
        yield param
        yield from _quantization_tensors(param)
    yield from model.buffers()


def grad_tensors(params: Iterable[torch.Tensor]) -> Iterator[torch.Tensor]:
    """The ``.grad`` of ``params`` that have one: ``grads``."""
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


# ---- the ledger ---------------------------------------------------------------------------
class CountedStorage(weakref.ref):
    """Weak reference to one counted storage, carrying what was counted for it."""

    __slots__ = ("key", "nbytes", "category", "born")
    key: int  # id() of the storage: stable while it lives
    nbytes: int
    category: int
    born: int  # the counter's clock when it was counted (a sequence number, a moment)


class LiveStorages:
    """Live bytes by category, each storage counted once and subtracted when it dies.

    The counters around it (tracker, trace) keep their own notion of time and peaks; they
    find a storage with ``records.get(id(storage))``.
    """

    def __init__(self) -> None:
        self.records: dict[int, CountedStorage] = {}
        self.bytes = [0] * len(CATEGORIES)  # live bytes per category
        self.total = 0

    def count(self, storage: torch.UntypedStorage, nbytes: int, category: int,
              born: int) -> CountedStorage:
        record = CountedStorage(storage, self._forget)
        record.key = id(storage)
        record.nbytes = nbytes
        record.category = category
        record.born = born
        self.records[record.key] = record
        self.bytes[category] += nbytes
        self.total += nbytes
        return record

    def promote(self, record: CountedStorage, category: int) -> bool:
        """Move ``record`` to ``category`` if it outranks its current one; whether it moved."""
        if not outranks(category, record.category):
            return False
        self.relabel(record, category)
        return True

    def relabel(self, record: CountedStorage, category: int) -> None:
        self.bytes[record.category] -= record.nbytes
        self.bytes[category] += record.nbytes
        record.category = category

    def resize(self, record: CountedStorage, nbytes: int) -> None:
        self.bytes[record.category] += nbytes - record.nbytes
        self.total += nbytes - record.nbytes
        record.nbytes = nbytes

    def discount(self, record: CountedStorage) -> None:
        """Stop counting ``record``'s storage (it is counted elsewhere from now on)."""
        if self.records.get(record.key) is record:
            del self.records[record.key]
            self.bytes[record.category] -= record.nbytes
            self.total -= record.nbytes

    def _forget(self, record: CountedStorage) -> None:
        # Runs when the StorageImpl dies (its Python object is preserved until then), so
        # the id cannot have been reused yet.
        self.discount(record)


# ---- the host pool ------------------------------------------------------------------------
class HostStorages:
    """Storages memfit keeps in host memory on purpose, and whether it is allocating some now.

    On a CUDA device they are CPU storages anyway; on a CPU device they look exactly like
    the device's own, so the offload code says which they are: ``mark_host`` tags existing
    tensors (a weak registry: a tag dies with its storage), and storages the tracker sees
    created inside ``host_allocations()`` (an offloaded copy, the state an offloaded
    optimizer creates in its step) are host storages from birth, never counted on the
    device first. ``allocating`` is a plain counter so the tracker's per-op check is one
    attribute read.
    """

    def __init__(self) -> None:
        self.ids: dict[int, weakref.ref] = {}  # id(storage) -> weak reference to it
        self.allocating = 0  # depth of host_allocations() contexts

    def mark(self, tensors: Iterable[torch.Tensor]) -> None:
        for tensor in tensors:
            for storage in storages_of(tensor):
                key = id(storage)
                if key not in self.ids:
                    self.ids[key] = weakref.ref(storage, lambda _, key=key: self._drop(key))

    def _drop(self, key: int) -> None:
        self.ids.pop(key, None)


HOST = HostStorages()


def mark_host(tensors: Iterable[torch.Tensor]) -> None:
    """Tag the storages of ``tensors`` as host memory (see ``HostStorages``)."""
    HOST.mark(tensors)


@contextlib.contextmanager
def host_allocations() -> Iterator[None]:
    """Storages created inside are host memory (on the CPU: not counted on the device)."""
    HOST.allocating += 1
    try:
        yield
    finally:
        HOST.allocating -= 1
