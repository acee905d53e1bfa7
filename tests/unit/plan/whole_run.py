"""The peak live tensor bytes of a whole ``memfit.train`` call, measured from outside it.

accuracy_cases.measure_peak measures the training steps with the loop's own meter; a run
also loads (and for QLoRA quantizes) its base, evaluates and saves, and the plan has to be
above all of it. ``measure_whole_run`` enters one ``monitor.tensor_tracker.TensorTracker``
around the entire call, so every storage any op creates there is counted (the meter inside
the loop enters trackers of its own; they sit above this one on the mode stack and pass
every op down to it), and the most bytes in each phase of the run (loading, steps...).

Two things are arranged so that what is counted is what a device would hold:

- transformers loads a folder's tensors in a thread pool unless ``HF_DEACTIVATE_ASYNC_LOAD``
  is set (it loads synchronously anyway when quantizing on the fly), and a dispatch mode
  sees only its own thread's ops: loading is made synchronous, so the loaded weights are
  seen being created. The bytes are the same either way (each tensor becomes a parameter).
- The tokenized splits are host memory on a GPU (each micro-batch is copied to the device;
  data/build.py), so ``build_datasets`` runs inside ``accounting.host_allocations`` and
  its tensors go to the tracker's host pool, not the device's peak.
- Constants that libraries create when they are imported (peft's tuners make 144 bytes of
  CPU tensors at module level) are host memory whatever the device, and a process imports
  them once: peft is imported before the tracker is entered, so the first case measured
  in a process counts what every later one does.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from memfit.accounting import host_allocations
from memfit.config.schema import Config
from memfit.monitor.tensor_tracker import TensorTracker

# The function names a run passes through, innermost first wins: the phase of the run an op
# belongs to (training/api.py, build.py, loop.py, step.py; checkpoint/export.py).
PHASES = {
    "load_base": "loading the base",
    "prepare_model": "adapters and techniques",
    "place_and_optimize": "placing, optimizer",
    "optimizer_step": "training step",
    "evaluate": "evaluation",
    "save_checkpoint": "checkpoint",
    "export_trained": "saving the result",
}


@dataclass(frozen=True)
class WholeRun:
    peak_bytes: int  # the most live tensor bytes at any moment of the call
    phase: str  # PHASES' name of where that moment was ("other": none of them)
    phase_peaks: dict[str, int]  # the most live bytes while in each phase
    step_peak_bytes: int  # the loop's own meter: its highest measured training step
    host_peak_bytes: int  # the host pool's most (the tokenized splits, offloaded bytes)


class _PhaseTracker(TensorTracker):
    """A TensorTracker that notes the most live bytes in each phase of the run."""

    def __init__(self) -> None:
        super().__init__()
        self.phase_peaks: dict[str, int] = {}

    def __torch_dispatch__(self, func: torch._ops.OpOverload, types: tuple[type, ...],
                           args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
                           ) -> Any:
        out = super().__torch_dispatch__(func, types, args, kwargs)
        phase = _phase(sys._getframe(1))
        self.phase_peaks[phase] = max(self.phase_peaks.get(phase, 0), self.live_bytes)
        return out

    @property
    def phase(self) -> str:
        return max(self.phase_peaks, key=self.phase_peaks.__getitem__, default="other")


def _phase(frame: Any) -> str:
    while frame is not None:
        name = PHASES.get(frame.f_code.co_name)
        if name is not None:
            return name
        frame = frame.f_back
    return "other"


@contextmanager
def _datasets_on_host() -> Iterator[None]:
    from memfit.training import build

    build_datasets = build.build_datasets

    def on_host(*args: Any, **kwargs: Any) -> Any:
        with host_allocations():
            return build_datasets(*args, **kwargs)

    build.build_datasets = on_host
    try:
        yield
    finally:
        build.build_datasets = build_datasets


@contextmanager
def _synchronous_loading() -> Iterator[None]:
    before = os.environ.get("HF_DEACTIVATE_ASYNC_LOAD")
    os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["HF_DEACTIVATE_ASYNC_LOAD"]
        else:
            os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = before


def measure_whole_run(config: Config, output_dir: Path) -> WholeRun:
    """Run ``memfit.train(config)`` into ``output_dir`` (a new folder) on CPU, measured
    whole: load, quantization, steps, evaluation, checkpoint and export."""
    import peft  # noqa: F401  (its import-time constants: module docstring)

    from memfit.training.api import train

    config = replace(config, train=replace(config.train, output_dir=str(output_dir)))
    tracker = _PhaseTracker()
    with _synchronous_loading(), _datasets_on_host(), tracker:
        result = train(config)
    return WholeRun(tracker.peak_bytes, tracker.phase, dict(tracker.phase_peaks),
                    result.peak_bytes or 0, tracker.host_peak_bytes)
