"""What one device holds when training runs as ``distributed.nproc`` processes, by
``distributed.strategy`` (itemize.py makes the step's ``StepBytes`` of it, and the
strategy's spec names the moments it adds: techniques/distribution_moments.py).

none  one process: nothing to add.
ddp   every rank holds the whole model and the whole optimizer state, as one process.
      PyTorch DDP (``gradient_as_bucket_view=True``) keeps the gradients of the parameters
      it reduces in its flat buckets, allocated when it wraps the model: they are alive
      for the whole step, the first micro-batch's forward included, and memfit zeroes
      them in place between steps (``Replicas.zero_grad``), so every micro-batch
      accumulates into them (on the very first step, before DDP has made them views,
      each fresh gradient lives until it is copied into its bucket); at one moment they
      exist twice (DDP's rebuild). GaLore weights projected in backward are not DDP's
      (memfit all-reduces their r x n projection): as one process.
      Layer-wise updates do without DDP: each gradient is all-reduced from its hook while
      the next one is computed, so one more full-size gradient is alive than in one process.
fsdp  weights (a QLoRA base's codes and scales too), gradients and optimizer state divided
      by the processes; FSDP2's all-gather working set added in forward and backward
      (a block's quantized bytes gathered as stored). With memory.optimizer_offload on an
      accelerator (FSDP2's CPUOffloadPolicy) the divided weights, gradients and state are
      host bytes: the device keeps the gathered units, the gradients still whole before
      their reduce-scatter, and the activations. An
      optimizer stepping each process's rows (8-bit AdamW, Adafactor, GaLore) keeps the
      state of those rows, costed by its spec on each device's rows, the most loaded
      device counting (an 8-bit shard under 4096 values keeps fp32 moments; its blocks of
      256 start at its rows; GaLore keeps P, and a wide weight's moments on R, whole).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memfit.config.schema import Config, DistributedStrategy
from memfit.optim.row_shards import RowShard
from memfit.plan.trace import TraceResult
from memfit.techniques.distribution import strategy_for
from memfit.techniques.moments import Split
from memfit.techniques.optimizers import (
    OptimizerSetting,
    Param,
    projects_in_backward,
    spec_for,
)


@dataclass(frozen=True)
class Units:
    """Weight bytes FSDP2 gathers per unit (distributed.fsdp: one per block): the
    floating-point weights and a quantized base's codes and scales."""

    block: int  # the largest repeated block
    block_trainable: int  # ... its trainable part (its unsharded gradients)
    root: int  # everything outside the blocks (embeddings, final norm, head)
    root_trainable: int  # ... its trainable part


@dataclass(frozen=True)
class Layout:
    """How training is spread over the devices: the optimizer's setting (its
    distributed.strategy and memory.optimizer_offload included) and distributed.nproc."""

    setting: OptimizerSetting
    processes: int

    @classmethod
    def of(cls, config: Config) -> Layout:
        return cls(OptimizerSetting.of(config), config.distributed.nproc)


def sharded_over(layout: Layout) -> int:
    """Devices weights, grads and state are divided over (1: each holds all of them), as
    the distribution strategy's spec says."""
    divides = strategy_for(layout.setting.strategy).divides_training_state
    return layout.processes if divides else 1


def sharded_weights(layout: Layout, weight_bytes: int) -> int:
    """Weights one process holds: FSDP2 shards all of them, a QLoRA base's packed codes
    and scales included (memfit.techniques.quantized_shards)."""
    return -(-weight_bytes // sharded_over(layout))


def shards_on_host(layout: Layout) -> bool:
    """memory.optimizer_offload under fsdp: FSDP2's CPUOffloadPolicy keeps each process's
    shards of the weights, their gradients and the optimizer state in host memory (on a
    CPU device too, where distributed/host_offload.py tags them as host for the tracker)."""
    return layout.setting.strategy is DistributedStrategy.FSDP and layout.setting.offloaded


def gathers(layout: Layout) -> bool:
    """Whether the device's forward and backward are FSDP2's: units gathered, gradients
    divided over several processes or moved to the host."""
    return sharded_over(layout) > 1 or shards_on_host(layout)


def traced_on_one_device(trace: TraceResult, layout: Layout, units: Units
                         ) -> tuple[Split, Split, Split]:
    """The traced micro-batch as one device holds it: (its most live bytes with the grads,
    the most bytes besides grads before backward, ... in backward). Without FSDP2 the
    last two are the trace's one moment with the most bytes besides grads (on one device
    the same upper bound)."""
    if gathers(layout):
        return fsdp_in_backward(trace, sharded_over(layout), units,
                                grad_shards_on_host=shards_on_host(layout))
    return trace.peak, trace.peak_without_grads, trace.peak_without_grads


def state_bytes(params: list[Param], layout: Layout, whole_state: int) -> int:
    """Optimizer state on the most loaded device (``whole_state``: all of it in one)."""
    devices = sharded_over(layout)
    if devices == 1:
        return whole_state
    setting = layout.setting
    spec = spec_for(setting.optimizer)
    if not spec.steps_local_rows:  # torch's optimizers step the DTensor shards
        return -(-whole_state // devices)

    # A weight's rows split into at most three sizes over the ranks (torch.chunk: full
    # chunks, a remainder, none), so each size is costed once, not once per rank: with
    # hundreds of devices the per-rank costing dominated the whole plan.
    costed: dict[tuple[int, int], int] = {}

    def of_rows(index: int, param: Param, rows: int) -> int:
        if rows == 0:  # more devices than rows: this one holds none of them, nor their state
            return 0
        if (index, rows) not in costed:
            if spec.row_shard_state is not None:
                costed[index, rows] = spec.row_shard_state(param, setting, rows)
            else:
                local = replace(param, shape=(rows, *param.shape[1:]))
                costed[index, rows] = spec.costs([local], setting)[0].state
        return costed[index, rows]

    return max(sum(of_rows(index, p, RowShard.of(p.shape, rank, devices).rows)
                   for index, p in enumerate(params))
               for rank in range(devices))


def whole_grad_bytes(units: Units) -> int:
    """Gradients alive unsharded in an FSDP2 backward: the running block's (until its
    reduce-scatter) and the root's (reduce-scattered last)."""
    return units.block_trainable + units.root_trainable


def fsdp_in_backward(trace: TraceResult, devices: int, units: Units,
                     grad_shards_on_host: bool = False) -> tuple[Split, Split, Split]:
    """The traced forward/backward peaks on one FSDP2 device, with the grads sharded, plus
    the all-gather working set: (with the grads, without them before backward, without
    them in backward).

    The root unit's weights stay gathered from forward to the end of backward (FSDP2
    does not reshard the root after forward); a block runs while the next is prefetched.
    A gradient stays whole until its unit's reduce-scatter: the running block's, and the
    root's (the head's comes first in backward, the root reduces last); the reduce-scatter
    copies its unit's gradients into one flat input, alive with them. So the moment with
    the grads is the larger of a block's reduce-scatter (root, two blocks, the block's
    flat copy) and the root's at the end (root and its flat copy), the whole gradients
    counted whole. Without the grads: the start of backward (the forward peak), and the
    backward moment with the most bytes besides grads (the activations of the blocks not
    yet reached), where a model whose forward peak is its logits peaks once FSDP2 has
    divided the grads, and where a layer-wise hook's grads are alive.
    ``grad_shards_on_host``: the reduce-scattered shards go to the host (CPUOffloadPolicy),
    so the device holds only the gradients still whole."""
    forward = units.root + 2 * units.block
    backward = max(forward + units.block_trainable, units.root + units.root_trainable)
    whole = whole_grad_bytes(units)
    grads = trace.peak["grads"]
    in_backward = grads > 0  # or the forward peak, grads still to come
    on_device = 0 if grad_shards_on_host else -(-grads // devices) - whole // devices
    sharded = min(grads, on_device + whole)
    with_grads = {**trace.peak, "grads": sharded,
                  "temporaries": trace.peak["temporaries"] + (backward if in_backward
                                                              else forward)}
    start = {**trace.peak_without_grads,
             "temporaries": trace.peak_without_grads["temporaries"] + forward}
    middle = {**trace.backward_without_grads, "grads": 0,
              "temporaries": trace.backward_without_grads["temporaries"] + backward}
    return with_grads, start, middle


def ddp_bucket_bytes(params: list[Param], layout: Layout) -> int:
    """Bytes of DDP's gradient buckets on each rank: the gradients of every trainable
    parameter DDP reduces (all but GaLore's weights projected in backward and untied input
    embeddings, which memfit reduces); 0 where DDP
    does not wrap the model (another strategy, or layer-wise updates)."""
    setting = layout.setting
    if setting.strategy is not DistributedStrategy.DDP or setting.optimizer.layerwise:
        return 0
    memfit_reduces = projects_in_backward(setting)
    return sum(p.nbytes for p in params
               if not (memfit_reduces and p.projected) and not p.row_sparse)


def in_flight_reduction_bytes(params: list[Param], layout: Layout) -> int:
    """Layer-wise updates under ddp: the gradient whose all-reduce is in flight while the
    hook of the next one runs — at most the second largest, the largest being the one
    consumed (itemize counts that)."""
    setting = layout.setting
    if setting.strategy is not DistributedStrategy.DDP or not setting.optimizer.layerwise:
        return 0
    sizes = sorted(p.nbytes for p in params)
    return sizes[-2] if len(sizes) > 1 else 0


def beside_hook_bytes(params: list[Param], layout: Layout, units: Units) -> int:
    """Layer-wise updates: gradients alive whole beside the one a hook consumes (the
    largest: under fsdp a root weight's, whole until the root reduces last): under fsdp
    the running block's, under ddp the one whose all-reduce is in flight."""
    running_block = units.block_trainable if sharded_over(layout) > 1 else 0
    return running_block + in_flight_reduction_bytes(params, layout)


def rank_zero_rows(params: list[Param], devices: int) -> list[Param]:
    """The parameters as process 0 holds them under FSDP2: its rows of each (torch.chunk's
    first chunk, the largest), so bytes costed on them are the most loaded process's."""
    return [replace(p, shape=(-(-p.shape[0] // devices), *p.shape[1:])) if p.shape else p
            for p in params]
