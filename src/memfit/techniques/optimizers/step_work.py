"""What an optimizer step asks of the device (techniques.work), per optimizer spec: the
planner's time model prices it (plan/step_time.py).

An element-wise update streams over each parameter a number of times: ``passes`` counts
parameter-sized fp32 tensors read or written per step (weight, gradient, each moment, and
the temporaries of each op in between), ``launches`` the ops per parameter. Counted from
the implementations (an op reading two tensors and writing one is three passes):

- torch AdamW (foreach): lerp_ m (3), mul_ + addcmul_ v (5), sqrt (2), div_ + add_ of the
  denominator (4), addcdiv_ into the weight (4), the decay's mul_ (2): 20 passes, 8 ops;
- bitsandbytes AdamW8bit: one fused block-wise kernel reading weight, grad and 8-bit
  moments and writing them back: ~4 passes, 2 ops; its arithmetic (dequantize, update,
  requantize by a search of the code book) is filed as "adamw8bit" values, which a CPU
  computes far slower than it moves their bytes (the profile's calibrated time per value);
- Adafactor (foreach=False): row and column means of g^2 and the update: ~14 passes, 15 ops;
- Lion: interpolation, sign, update and momentum: ~10 passes, 6 ops;
- SGD: read the gradient, read and write the weight: 3 passes, 1 op; with momentum, the
  buffer's mul_ (2) and add_ of the gradient (3), then the weight's add_ of it (3): 8
  passes, 3 ops;
- anything else (a class path): 12 passes, 8 ops.

GaLore adds its own (galore.py): the projections' matmuls and the refresh amortised over
optimizer.galore.update_gap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from memfit.techniques.optimizers.setting import OptimizerSetting
from memfit.techniques.work import Work, memory


class Sized(Protocol):
    """What a step's work reads of a parameter (spec.Param; spec.py imports this module)."""

    @property
    def numel(self) -> int: ...


# (the trainable parameters, their spec.ParamCost each, the setting) -> the step's work.
StepWork = Callable[[Sequence[Any], Sequence[Any], OptimizerSetting], Work]
# (the trainable parameters, the setting, tokens per micro-batch) -> (work the trace counted
# that training does not do, work it does instead), per micro-batch.
BackwardWork = Callable[[Sequence[Any], OptimizerSetting, int], tuple[Work, Work]]


@dataclass(frozen=True)
class Passes:
    passes: float  # fp32 parameter-sized tensors read or written per step
    launches: int  # ops per parameter
    # the values it updates filed under this name (techniques.work's "elements"), for an
    # update whose arithmetic a device may take longer over than its bytes
    arithmetic: str | None = None

    def of(self, numel: int) -> Work:
        """This update over ``numel`` values."""
        work = memory(int(self.passes * 4 * numel), self.launches)
        if self.arithmetic is None:
            return work
        key = ("elements", self.arithmetic, 0)
        return work.plus(Work({key: 1}, {key: numel}))


# The counts of the module docstring.
ADAMW, ADAMW8BIT, ADAFACTOR = Passes(20, 8), Passes(4, 2, "adamw8bit"), Passes(14, 15)
LION, SGD, SGD_MOMENTUM, OTHER = Passes(10, 6), Passes(3, 1), Passes(8, 3), Passes(12, 8)


def streaming(update: Passes) -> StepWork:
    """An element-wise step over every parameter (module docstring)."""
    def work(params: Sequence[Sized], costs: Sequence[Any], setting: OptimizerSetting) -> Work:
        total = Work()
        for param in params:
            total = total.plus(update.of(param.numel))
        return total

    return work
