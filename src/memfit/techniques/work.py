"""Work: what one piece of a training step asks of a device, by the resource it waits on.
The planner prices it in seconds with a device profile (plan/devices.py, plan/step_time.py).

- ``matmul``: FLOPs of matmuls, convolutions and attention, by compute dtype and by the
  product's smallest dimension (a skinny or small product runs far below a device's
  peak);
- ``memory``: bytes read and written by every other op that touches data (element-wise
  ops, norms, softmax, casts, copies, the optimizer's update), by the size of one call;
- ``elements``: the values those ops write, by op name: an op whose arithmetic, not its
  bytes, sets its time (a random draw for dropout, a tanh) costs its device a time per
  value beyond its bytes, which a calibration measures (plan/calibrate.py);
- ``launches``: every op dispatched, views and metadata ops included: each costs the host a
  fixed time (Python, autograd and the dispatcher; on CUDA a kernel launch);
- ``host_copy``: bytes copied device -> host (activation offload: the same bytes come back
  in backward), priced at the device's host link;
- ``exchanged``, ``exchanges``: bytes sent to the other processes of a sequence group and
  the all-to-alls that send them (sequence parallelism's, inside forward and backward),
  priced at the interconnect like the strategy's collectives.

Calls are grouped by size in powers of two (``size_class``), so a trace of a 70B model's
stand-ins stays a few dozen numbers and extrapolates in depth like the bytes do. Every
field is linear in what it counts: ``plus``, ``minus``, ``times`` and ``grown`` keep it so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# (kind, dtype name, size class): kind "matmul" (FLOPs; the class of its smallest
# dimension), "memory" (bytes; the class of the bytes one call moves; dtype "", or the
# 16-bit float dtype all of the op's float tensors share) or
# "elements" (values written; the op's name in place of the dtype, class 0).
Key = tuple[str, str, int]


def size_class(amount: int) -> int:
    """The power of two an amount per call rounds down to (0 for 0 or 1)."""
    return max(amount, 1).bit_length() - 1


@dataclass(frozen=True)
class Work:
    calls: dict[Key, int] = field(default_factory=dict)  # kernels of each key
    amounts: dict[Key, int] = field(default_factory=dict)  # their FLOPs or bytes
    launches: int = 0  # every op dispatched (views included)
    host_copy: int = 0  # bytes device -> host (and as many back)
    exchanged: int = 0  # bytes sent to the other processes of a sequence group
    exchanges: int = 0  # the all-to-alls sending them

    def plus(self, other: Work) -> Work:
        return Work(_sum(self.calls, other.calls), _sum(self.amounts, other.amounts),
                    self.launches + other.launches, self.host_copy + other.host_copy,
                    self.exchanged + other.exchanged, self.exchanges + other.exchanges)

    def minus(self, other: Work) -> Work:
        """This work without ``other``'s, key by key, never below 0: a spec's account of
        work the trace counted but training does not do (GaLore's full weight gradients);
        an amount the trace filed under another key stays counted."""
        def less(a: dict[Key, int], b: dict[Key, int]) -> dict[Key, int]:
            return {key: max(0, value - b.get(key, 0)) for key, value in a.items()}

        return Work(less(self.calls, other.calls), less(self.amounts, other.amounts),
                    max(0, self.launches - other.launches),
                    max(0, self.host_copy - other.host_copy),
                    max(0, self.exchanged - other.exchanged),
                    max(0, self.exchanges - other.exchanges))

    def times(self, factor: int) -> Work:
        return Work({k: v * factor for k, v in self.calls.items()},
                    {k: v * factor for k, v in self.amounts.items()},
                    self.launches * factor, self.host_copy * factor,
                    self.exchanged * factor, self.exchanges * factor)

    @property
    def flops(self) -> int:
        return sum(v for (kind, _, _), v in self.amounts.items() if kind == "matmul")

    @property
    def memory_bytes(self) -> int:
        return sum(v for (kind, _, _), v in self.amounts.items() if kind == "memory")


def matmul(flops: int, dtype: str, side: int, calls: int = 1) -> Work:
    """``calls`` matmuls of ``flops`` in all, in ``dtype``, whose smallest dimension is
    ``side``."""
    key = ("matmul", dtype, size_class(side))
    return Work({key: calls}, {key: flops}, calls)


def memory(nbytes: int, calls: int = 1) -> Work:
    """``calls`` memory-bound ops moving ``nbytes`` in all."""
    key = ("memory", "", size_class(nbytes // max(calls, 1)))
    return Work({key: calls}, {key: nbytes}, calls)


def _sum(a: dict[Key, int], b: dict[Key, int]) -> dict[Key, int]:
    out = dict(a)
    for key, value in b.items():
        out[key] = out.get(key, 0) + value
    return out
