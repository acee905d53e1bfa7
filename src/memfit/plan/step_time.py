"""Seconds per optimizer step: the work of a step (``StepWork``, what itemize.py knows of a
configuration, device-independent) priced with a device profile (devices.py).

    per micro-batch  forward + backward as traced (recomputation, the tiled MLP's chunks,
                     the chunked loss, QLoRA's dequantization all run there):
                       device = matmul FLOPs / the profile's rate at each call's size
                              + bytes moved / its bandwidth at each call's size
                              + values written x the profile's time per value of
                                their op beyond its bytes (dropout's draws on a CPU)
                       host   = ops x the profile's host cost per op
                     summed on a synchronous device (CPU), the larger of the two on CUDA
                     (ops are queued while the device works);
                     + activation offload: its bytes down and back over the host link
                     (memfit's copies run on the compute stream: no overlap)
    per step         the optimizer step (its spec's work: techniques.optimizers.step_work),
                     on the host with optimizer offload (+ gradients down, weights up);
                     + collectives: the bytes each process sends (the strategy spec's,
                     and each micro-batch's sequence-parallel all-to-alls) over the
                     interconnect and a latency per collective, not overlapped with
                     compute
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memfit.plan.devices import DeviceProfile, Table
from memfit.techniques.distribution_traffic import Traffic
from memfit.techniques.work import Work


@dataclass(frozen=True)
class StepWork:
    micro_batch: Work  # one micro-batch's forward and backward
    micro_batches: int  # per optimizer step (gradient accumulation)
    optimizer: Work  # one optimizer step
    optimizer_on_host: bool  # memory.optimizer_offload: the step runs on the host
    host_transfer_bytes: int  # per optimizer step, over the host link (optimizer offload)
    collectives: Traffic  # per optimizer step: what each process sends, in how many calls
    tokens: int | None  # tokens per optimizer step over all processes; None: not token data


@dataclass(frozen=True)
class StepTime:
    seconds: float  # per optimizer step
    parts: dict[str, float]  # forward+backward, offload, optimizer, collectives: per step
    tokens: int | None

    @property
    def tokens_per_second(self) -> float | None:
        return None if self.tokens is None else self.tokens / self.seconds

    def to_json(self) -> dict:
        return {"step_seconds": self.seconds,
                "tokens_per_second": self.tokens_per_second,
                "step_parts": dict(self.parts)}


def step_time(work: StepWork, profile: DeviceProfile) -> StepTime:
    micro = work.micro_batch
    host_copy = 2 * micro.host_copy / profile.host_link  # down in forward, back in backward
    optimizer = (host_seconds(work.optimizer, profile) if work.optimizer_on_host
                 else seconds(work.optimizer, profile))
    parts = {"forward+backward": work.micro_batches * seconds(micro, profile),
             "offload": (work.micro_batches * host_copy
                         + work.host_transfer_bytes / profile.host_link),
             "optimizer": optimizer,
             "collectives": (
                 (work.collectives.bytes + work.micro_batches * micro.exchanged)
                 / profile.interconnect
                 + (work.collectives.calls + work.micro_batches * micro.exchanges)
                 * profile.collective_seconds)}
    return StepTime(sum(parts.values()), parts, work.tokens)


def seconds(work: Work, profile: DeviceProfile) -> float:
    """The device's and the host's time for ``work`` (module docstring), no offload."""
    device, host = device_seconds(work, profile), work.launches * profile.op_seconds
    return max(device, host) if profile.asynchronous else device + host


def device_seconds(work: Work, profile: DeviceProfile) -> float:
    """Matmul FLOPs and bytes moved, priced at the rate of each call's size class [2^k,
    2^(k+1)): a matmul's smallest side at its class's floor (sides are mostly powers of
    two), bytes at its middle (by the table of their 16-bit dtype, where the profile has
    one); values written at their op's time per value, if any."""
    total = 0.0
    for (kind, dtype, size), amount in work.amounts.items():
        if kind == "matmul":
            table = profile.matmul.get(dtype) or profile.matmul["float32"]
            total += amount / rate(table, 2.0**size)
        elif kind == "elements":  # dtype holds the op's name
            total += amount * profile.element_seconds.get(dtype, 0.0)
        else:
            table = profile.memory_by_dtype.get(dtype) or profile.memory
            total += amount / rate(table, 1.5 * 2.0**size)
    return total


def host_seconds(work: Work, profile: DeviceProfile) -> float:
    """``work`` done by the host CPU (an offloaded optimizer step): its bytes at the host's
    memory bandwidth, its FLOPs at the host's rate."""
    return work.memory_bytes / profile.host_memory + work.flops / profile.host_flops


def rate(table: Table, per_call: float) -> float:
    """The table's rate at ``per_call``, log-linear between its points, flat beyond."""
    if per_call <= table[0][0]:
        return table[0][1]
    for (size_a, rate_a), (size_b, rate_b) in zip(table, table[1:], strict=False):
        if per_call <= size_b:
            share = (math.log(per_call) - math.log(size_a)) / (math.log(size_b) - math.log(size_a))
            return math.exp(math.log(rate_a) + share * (math.log(rate_b) - math.log(rate_a)))
    return table[-1][1]
