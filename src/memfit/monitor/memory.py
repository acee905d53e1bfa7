"""Per-step memory meters: one interface for CPU (exact, simulated budget) and CUDA.

The training loop uses only this::

    meter = make_memory_meter(device, budget_bytes)   # budget_bytes: int | None
    meter.attach(model, optimizer)                    # owners of weights / grads / state
    with meter.step(number):                          # optimizer step `number`: forward,
        ...                                           # backward, step of all micro-batches
    with meter.evaluation():                          # an evaluation (budget enforced)
        ...
    meter.last_step   # StepMemory of the step just finished; None if it was not measured
    meter.peak        # StepMemory of the highest-peak measured step (None before one)
    record.update(meter.last_step.to_record())        # flat ints for metrics.jsonl

``StepMemory.by_category`` splits ``peak_bytes`` into ``weights``, ``grads``,
``optimizer``, ``activations`` and ``temporaries`` at the moment of the peak (on CPU the
parts sum to ``peak_bytes`` exactly). ``to_record()`` gives ``memory_peak_bytes``,
``memory_<category>_bytes``, ``memory_live_bytes_at_end`` (+ ``memory_budget_bytes``,
``memory_peak_reserved_bytes``, ``memory_host_peak_bytes`` when known); ``memory_plot``
reads those keys. None of the categories holds host memory: on CPU the tracker keeps what
memfit offloads to the host in a pool of its own (``host_peak_bytes``).

- CPU (``CpuMemoryMeter``): a ``TensorTracker`` (see ``tensor_tracker``) counts live tensor
  storages exactly, so bytes match ``plan`` to the byte and do not depend on the allocator;
  with a budget it raises ``torch.OutOfMemoryError`` like a full device. What the offload
  techniques move to the host is counted apart (``host_peak_bytes``: the most host bytes
  alive at once in the step), never in the device's peak. If the body of
  ``step()`` raises (OOM included), nothing is recorded for that step and the tracker
  stays consistent: tensors are subtracted as they die, so the caller can retry.
- CUDA (``CudaMemoryMeter``): ``torch.cuda`` allocator statistics, peak reset at each step
  start; weights/grads/optimizer are summed from the tensors, and ``activations`` is the
  rest of the peak (activations and temporaries together: ``split_is_exact`` is False).
  A budget caps the caching allocator with ``set_per_process_memory_fraction``.

A step may wrap evaluation under ``torch.inference_mode`` or an in-place
``optimizer.step()``; steps cannot be nested. ``every_n_steps`` says which numbered steps
are measured (``measures``), because the CPU tracker costs ~10 us per aten op: with
``"auto"`` (``log.memory_every``'s default) a CPU run without a budget measures steps 1
and 2 -- step 1 allocates the optimizer state, step 2 holds it through forward and
backward, the steady state -- then every step whose batches are larger than those of
every step measured before (padded rows: a longer batch is a higher peak), and every
``AUTO_EVERY``-th step, which keeps the tracker's cost to a few percent of a run; CUDA's
counters cost nothing and a CPU budget is enforced by the tracker, so those measure every
step.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from memfit._utils.errors import ConfigError
from memfit.accounting import (
    CATEGORIES,
    grad_tensors,
    optimizer_params,
    optimizer_state_tensors,
    storages_of,
    weight_tensors,
)
from memfit.monitor.tensor_tracker import TensorTracker

__all__ = [
    "AUTO",
    "AUTO_EVERY",
    "AUTO_FIRST_STEPS",
    "CATEGORIES",
    "RECORD_BUDGET_KEY",
    "RECORD_HOST_PEAK_KEY",
    "RECORD_PEAK_KEY",
    "CpuMemoryMeter",
    "CudaMemoryMeter",
    "MemoryMeter",
    "StepMemory",
    "make_memory_meter",
    "record_key",
]


@dataclass(frozen=True)
class StepMemory:
    """Memory of one step. Bytes are exact on CPU; on CUDA see ``split_is_exact``."""

    peak_bytes: int
    by_category: dict[str, int]  # at the peak; keys are CATEGORIES; sums to peak_bytes
    live_bytes_at_start: int
    live_bytes_at_end: int
    device: str
    budget_bytes: int | None = None
    split_is_exact: bool = True
    peak_reserved_bytes: int | None = None  # CUDA caching allocator; None on CPU
    host_peak_bytes: int | None = None  # offloaded to the host (CPU tracker); None on CUDA

    def to_record(self) -> dict[str, int]:
        """Flat integer keys for ``metrics.jsonl`` / TensorBoard and ``plot_memory``."""
        record = {RECORD_PEAK_KEY: self.peak_bytes}
        record.update({record_key(name): size for name, size in self.by_category.items()})
        record["memory_live_bytes_at_end"] = self.live_bytes_at_end
        if self.budget_bytes is not None:
            record[RECORD_BUDGET_KEY] = self.budget_bytes
        if self.peak_reserved_bytes is not None:
            record["memory_peak_reserved_bytes"] = self.peak_reserved_bytes
        if self.host_peak_bytes is not None:
            record[RECORD_HOST_PEAK_KEY] = self.host_peak_bytes
        return record


RECORD_PEAK_KEY = "memory_peak_bytes"
RECORD_HOST_PEAK_KEY = "memory_host_peak_bytes"
RECORD_BUDGET_KEY = "memory_budget_bytes"


def record_key(category: str) -> str:
    """The ``to_record`` key of one category: ``"grads"`` -> ``"memory_grads_bytes"``."""
    return f"memory_{category}_bytes"


# every_n_steps="auto" (log.memory_every=auto) on a CPU without a budget: the first steps,
# where the peak is set (1: optimizer state allocated; 2: the steady state holding it), a
# step with larger batches than any measured, and one step in AUTO_EVERY.
AUTO = "auto"
AUTO_FIRST_STEPS = 2
AUTO_EVERY = 100


class MemoryMeter(ABC):
    """Measures the peak memory of each training step and where it went."""

    # Whether measuring costs next to nothing (so "auto" measures every step).
    measures_cheaply = False

    def __init__(
        self, device: torch.device, budget_bytes: int | None, every_n_steps: int | str = 1
    ) -> None:
        self.device = device
        self.budget_bytes = budget_bytes
        self.every_n_steps = every_n_steps
        self.last_step: StepMemory | None = None
        self.peak: StepMemory | None = None
        self._largest_measured = 0  # batch_elements of the largest step measured so far
        self._models: list[nn.Module] = []
        self._optimizers: list[torch.optim.Optimizer] = []
        self._in_step = False

    def attach(
        self, model: nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None
    ) -> None:
        """Say which model's parameters/buffers/grads and which optimizer's state to count.

        Call again after replacing either (an optimizer rebuilt after an OOM back-off, a
        merged model): the new one replaces the old; ``None`` keeps the current one.
        """
        # Replacing, not adding: a rebuilt optimizer's predecessor must not be kept alive.
        if model is not None:
            self._models = [model]
        if optimizer is not None:
            self._optimizers = [optimizer]

    @property
    def enforces_budget(self) -> bool:
        """Whether the budget holds only inside ``step()`` (the CPU tracker simulates it; the
        CUDA allocator enforces its cap everywhere)."""
        return False

    def measures(self, number: int, batch_elements: int = 0) -> bool:
        """Whether optimizer step ``number`` (1-based), whose largest batch tensor has
        ``batch_elements`` elements, is measured: every ``every_n_steps``-th (``step % n ==
        0``), or by ``"auto"`` (see the module's docstring); every step where the budget is
        enforced by measuring."""
        every = self.every_n_steps
        if every == 1 or self.enforces_budget:
            return True
        if every == AUTO:
            return (self.measures_cheaply or number <= AUTO_FIRST_STEPS
                    or number % AUTO_EVERY == 0 or batch_elements > self._largest_measured)
        return number % every == 0

    @contextlib.contextmanager
    def step(self, number: int | None = None,
             batches: Iterable[Mapping[str, torch.Tensor]] = ()) -> Iterator[None]:
        """Measure one optimizer step (all its micro-batches); records on normal exit.

        ``number``: the optimizer step's number, measured only if ``measures(number, ...)``
        of its micro-batches ``batches`` (otherwise it runs untouched and ``last_step`` is
        None); None: measured.
        """
        if self._in_step:
            raise RuntimeError("memory meter steps cannot be nested")
        elements = max((value.numel() for batch in batches for value in batch.values()
                        if isinstance(value, torch.Tensor)), default=0)
        self._in_step = True
        self.last_step = None  # until this step finishes
        try:
            if number is not None and not self.measures(number, elements):
                yield  # not measured: costs nothing
                return
            self._largest_measured = max(self._largest_measured, elements)
            start = self._begin()
            with self._active():
                yield
        finally:
            self._in_step = False
        memory = self._end(start)
        self.last_step = memory
        if self.peak is None or memory.peak_bytes > self.peak.peak_bytes:
            self.peak = memory

    def evaluation(self) -> contextlib.AbstractContextManager[None]:
        """Around an evaluation: measured where that enforces the budget (a CPU budget), so
        an evaluation can run out of memory as a device would; otherwise untouched, since
        nothing records an evaluation's memory."""
        return self.step() if self.enforces_budget else contextlib.nullcontext()

    @abstractmethod
    def _begin(self) -> int:
        """Start a peak window; return the bytes live at the start."""

    @abstractmethod
    def _active(self) -> contextlib.AbstractContextManager[object]:
        """What must be entered around the step body."""

    @abstractmethod
    def _end(self, start: int) -> StepMemory:
        """The finished step's memory."""


class CpuMemoryMeter(MemoryMeter):
    """Exact live-storage accounting on CPU, with an optional simulated device budget."""

    def __init__(self, budget_bytes: int | None = None, every_n_steps: int | str = 1) -> None:
        if budget_bytes is not None and every_n_steps not in (1, AUTO):
            raise ConfigError(
                f"every_n_steps={every_n_steps} with a CPU memory budget: the simulated budget "
                "is only enforced on measured steps, so every_n_steps must be 1 or auto"
            )
        super().__init__(torch.device("cpu"), budget_bytes, every_n_steps)
        self.tracker = TensorTracker(budget_bytes)

    @property
    def enforces_budget(self) -> bool:
        return self.budget_bytes is not None

    def attach(
        self, model: nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None
    ) -> None:
        super().attach(model, optimizer)
        self.tracker.attach(model, optimizer)

    def _begin(self) -> int:
        tracker = self.tracker
        tracker.forget_activations()
        tracker.scan()  # grads kept from the last step, state loaded from a checkpoint...
        tracker.check_budget()
        tracker.reset_peak()
        return tracker.live_bytes

    def _active(self) -> TensorTracker:
        return self.tracker

    def _end(self, start: int) -> StepMemory:
        # Grads / state assigned late move to their category, in the peak split too.
        self.tracker.scan(include_weights=False)
        return StepMemory(
            peak_bytes=self.tracker.peak_bytes,
            by_category=self.tracker.peak_by_category(),
            live_bytes_at_start=start,
            live_bytes_at_end=self.tracker.live_bytes,
            device="cpu",
            budget_bytes=self.budget_bytes,
            host_peak_bytes=self.tracker.host_peak_bytes,
        )


def _device_bytes(tensors: Iterable[torch.Tensor], device: torch.device, seen: set[int]) -> int:
    """Bytes of the distinct storages on ``device`` among ``tensors`` not yet in ``seen``."""
    total = 0
    for tensor in tensors:
        for storage in storages_of(tensor):
            if storage.device == device and id(storage) not in seen:
                seen.add(id(storage))
                total += storage.nbytes()
    return total


class CudaMemoryMeter(MemoryMeter):
    """CUDA allocator statistics per step; the category split is best effort."""

    measures_cheaply = True  # counters the allocator keeps anyway, and a walk of the tensors

    def __init__(
        self, device: torch.device, budget_bytes: int | None = None,
        every_n_steps: int | str = 1,
    ) -> None:
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        super().__init__(device, budget_bytes, every_n_steps)
        if budget_bytes is not None:
            # The caching allocator raises torch.OutOfMemoryError past this fraction of the
            # card, so the budget behaves like a smaller GPU (it caps reserved memory).
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total), device)
        self._most_grads_and_state = (0, 0)

    def _split_now(self) -> tuple[int, int, int]:
        # In CATEGORIES' priority order, with ``seen`` shared: a storage counts in the
        # first category it belongs to, as the CPU tracker counts it.
        seen: set[int] = set()
        weights = sum(_device_bytes(weight_tensors(m), self.device, seen) for m in self._models)
        params = [p for m in self._models for p in m.parameters()]
        params += [p for o in self._optimizers for p in optimizer_params(o)]
        grads = _device_bytes(grad_tensors(params), self.device, seen)
        state = sum(
            _device_bytes(optimizer_state_tensors(o), self.device, seen) for o in self._optimizers
        )
        return weights, grads, state

    def _after_optimizer_step(self, *_: object) -> None:
        # Grads are usually freed by zero_grad before the step ends; sample them here.
        _, grads, state = self._split_now()
        most_grads, most_state = self._most_grads_and_state
        self._most_grads_and_state = (max(most_grads, grads), max(most_state, state))

    def _begin(self) -> int:
        torch.cuda.reset_peak_memory_stats(self.device)
        self._most_grads_and_state = (0, 0)
        return torch.cuda.memory_allocated(self.device)

    @contextlib.contextmanager
    def _active(self) -> Iterator[None]:
        handle = register_optimizer_step_post_hook(self._after_optimizer_step)
        try:
            yield
        finally:
            handle.remove()

    def _end(self, start: int) -> StepMemory:
        # Allocator statistics are updated on the host at call time: no synchronize needed.
        peak = torch.cuda.max_memory_allocated(self.device)
        weights, grads, state = self._split_now()
        grads = max(grads, self._most_grads_and_state[0])
        state = max(state, self._most_grads_and_state[1])
        rest = max(0, peak - weights - grads - state)
        return StepMemory(
            peak_bytes=peak,
            by_category={
                "weights": weights,
                "grads": grads,
                "optimizer": state,
                "activations": rest,  # activations and temporaries together
                "temporaries": 0,
            },
            live_bytes_at_start=start,
            live_bytes_at_end=torch.cuda.memory_allocated(self.device),
            device=str(self.device),
            budget_bytes=self.budget_bytes,
            split_is_exact=False,
            peak_reserved_bytes=torch.cuda.max_memory_reserved(self.device),
        )


def make_memory_meter(
    device: torch.device | str, budget_bytes: int | None = None, *,
    every_n_steps: int | str = 1,
) -> MemoryMeter:
    """The meter for ``device`` ("cpu" or "cuda[:N]").

    ``budget_bytes`` caps live bytes (CPU: simulated, CUDA: allocator fraction).
    ``every_n_steps``: which numbered steps (``step(number)``) are measured: n measures
    steps n, 2n, 3n, ...; ``"auto"`` the first steps and a sample (see ``measures``). The
    others run untouched and leave ``last_step`` None. On CPU the tracker slows tiny
    models several-fold, so sampling is how an unbudgeted CPU run keeps its speed; a CPU
    budget needs 1 or "auto" (which then measures every step).
    """
    device = torch.device(device)
    if budget_bytes is not None and (
        isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes <= 0
    ):
        raise ConfigError(f"memory budget must be a positive number of bytes, got {budget_bytes!r}")
    if every_n_steps != AUTO and (isinstance(every_n_steps, bool)
                                  or not isinstance(every_n_steps, int) or every_n_steps < 1):
        raise ConfigError(
            f"every_n_steps must be a positive integer or {AUTO!r}, got {every_n_steps!r}")
    if device.type == "cpu":
        return CpuMemoryMeter(budget_bytes, every_n_steps)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {str(device)!r} requested but CUDA is not available")
        return CudaMemoryMeter(device, budget_bytes, every_n_steps)
    raise ConfigError(
        f"no memory meter for device {str(device)!r}; valid device types: 'cpu', 'cuda'"
    )
