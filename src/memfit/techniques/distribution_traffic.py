"""What each distribution strategy sends between processes per optimizer step: the bytes
each process sends (ring collectives: an all-reduce of B bytes over N processes sends
2 (N-1)/N B, an all-gather or reduce-scatter (N-1)/N B) and the collectives it calls
(each costs a fixed latency), for the planner's time model (plan/step_time.py prices them
at the device profile's interconnect).

- none: nothing;
- ddp: the gradients all-reduced once per step (earlier micro-batches run under no_sync),
  in DDP's 25 MiB buckets;
- fsdp: per micro-batch each unit's weights all-gathered in forward and again in backward
  (FSDP2 reshards after forward) and its gradients reduce-scattered: three collectives
  per unit (the blocks and the root).
"""

from __future__ import annotations

from dataclasses import dataclass

DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's bucket_cap_mb default


@dataclass(frozen=True)
class TrafficSizes:
    grad_bytes: int  # every trainable parameter's gradient, whole
    sharded_bytes: int  # what FSDP2 shards and gathers: parameters and a quantized base
    units: int  # FSDP2's units: the blocks and the root
    processes: int  # distributed.nproc
    micro_batches: int  # train.gradient_accumulation_steps


@dataclass(frozen=True)
class Traffic:
    bytes: int  # what each process sends per optimizer step
    calls: int  # collectives per optimizer step


def _ring(processes: int) -> float:
    return (processes - 1) / processes


def no_traffic(sizes: TrafficSizes) -> Traffic:
    return Traffic(0, 0)


def ddp_traffic(sizes: TrafficSizes) -> Traffic:
    return Traffic(int(2 * _ring(sizes.processes) * sizes.grad_bytes),
                   -(-sizes.grad_bytes // DDP_BUCKET_BYTES))


def fsdp_traffic(sizes: TrafficSizes) -> Traffic:
    micro_batches = sizes.micro_batches
    per_micro_batch = _ring(sizes.processes) * (2 * sizes.sharded_bytes + sizes.grad_bytes)
    return Traffic(int(per_micro_batch * micro_batches), 3 * sizes.units * micro_batches)
