"""One configuration -> itemized bytes at its peak.

    weights      distinct parameter + buffer storages of the meta model (techniques applied)
    grads        trainable parameters' gradients, as many as are alive at the peak
    optimizer    optimizer state (costs.py); in host memory with memory.optimizer_offload
                 (on a CPU device too: training really copies it, and the tracker counts
                 its host pool apart; ``host_bytes``)
    activations  saved for backward (traced, trace.py)
    temporaries  everything else alive at the peak: in-flight forward values, gradients of
                 activations, optimizer-step scratch

The peak is the largest of the step's named moments (plan/moments.py: the traced
micro-batch's, the optimizer spec's and the distribution strategy spec's, each with what
is alive then and why), made of one ``StepBytes``; the estimate names the moment that sets
it. As ``distributed.nproc`` processes (``--devices N`` when planning), bytes are per
device, as per_device.py says for each ``distributed.strategy``: ddp keeps one process's
weights and state and DDP's gradient buckets; fsdp divides weights, grads and state by N
and adds its all-gather working set (with memory.optimizer_offload, FSDP2's
CPUOffloadPolicy, the shards, their grads and state are host bytes instead, and the
device keeps the gathered units and the whole gradients).

Hugging Face models deeper than ``EXACT_DEPTH`` are built (on meta) and traced with 2 and 3
layers, and every quantity — weights, the trainable parameters, the traced bytes — is
extrapolated linearly in depth (the blocks repeat), so a 70B model is planned in seconds.
Where the blocks are of several kinds (a technique acting on some blocks only, by its
spec's ``BlockRule``: memory.checkpoint_blocks, checkpoint_every, offload_blocks,
freeze_blocks), stand-ins of each kind are traced and each kind's blocks add their own
increment.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memfit._utils.errors import ConfigError
from memfit._utils.exact_key import exact_key
from memfit.config.schema import Config, Task
from memfit.plan import costs, meta, moments, per_device
from memfit.plan.offload_in_blocks import traced_offload_in_blocks
from memfit.plan.step_time import StepWork
from memfit.plan.trace import TraceResult, trace_micro_batch
from memfit.plan.trace_inputs import TraceInputs
from memfit.plan.workload import ExampleBatch, workload
from memfit.techniques import blocks, registry
from memfit.techniques.distribution import strategy_for
from memfit.techniques.distribution_traffic import TrafficSizes
from memfit.techniques.moments import Moment, StepBytes
from memfit.techniques.optimizers import OptimizerSetting, spec_for
from memfit.techniques.precision import AUTOCAST_DTYPES
from memfit.techniques.quantize_stand_in import QuantizedLinear, quantizing_bytes
from memfit.techniques.technique_options import TechniqueOptions

EXACT_DEPTH = 4


@dataclass(frozen=True)
class Estimate:
    """Bytes of one configuration; ``bytes`` is split at the peak and sums to it, and
    ``peak_moment`` is the moment of the step that sets it. ``to_json`` is the "E" of the
    documented --json schema, exactly."""

    bytes: dict[str, int]
    peak_tensor_bytes: int
    device_overhead_bytes: int
    host_bytes: int
    micro_batch_size: int
    gradient_accumulation_steps: int
    peak_moment: Moment
    work: StepWork  # what one optimizer step asks of a device (priced by plan.step_time)

    @property
    def device_bytes(self) -> int:
        return self.peak_tensor_bytes + self.device_overhead_bytes

    def to_json(self) -> dict[str, Any]:
        return {"bytes": dict(self.bytes), "peak_tensor_bytes": self.peak_tensor_bytes,
                "device_overhead_bytes": self.device_overhead_bytes,
                "host_bytes": self.host_bytes,
                "peak_moment": {"name": self.peak_moment.name, "why": self.peak_moment.why}}


@dataclass(frozen=True)
class _Sizing:
    """What the model itself decides: weights, trainable parameters, one micro-batch."""

    weight_bytes: int
    sharded_bytes: int  # what FSDP2 shards: the parameters and a quantized base's bytes
    params: list[costs.Param]
    trace: TraceResult
    units: per_device.Units  # what FSDP2 gathers
    batch_bytes: int  # one micro-batch's input tensors
    quantizing: int = 0  # quantize_stand_in.quantizing_bytes: loading a quantized base


@dataclass(frozen=True)
class _Traced:
    """What the model and one micro-batch decide, whatever the optimizer: the built meta
    model (its parameters fake after the trace) and the traced bytes."""

    model: nn.Module
    weight_bytes: int
    sharded_bytes: int
    trace: TraceResult
    units: per_device.Units
    batch_bytes: int
    quantizing: int = 0


_SIZING_CACHE: dict[tuple, _Sizing] = {}
# Keyed on what the trace reads (TraceInputs), which holds no optimizer key (the
# optimizer's own bytes are its spec's moments): strategies that differ in the optimizer
# only share one trace.
_TRACE_CACHE: dict[tuple, _Traced] = {}


def estimate(config: Config, device: str = "cuda",
             example_batch: ExampleBatch | None = None) -> Estimate:
    """Itemized bytes of training with ``config`` (see the module docstring)."""
    layout = per_device.Layout.of(config)
    inputs = TraceInputs.of(config, device)
    sizing = _sizing(inputs, layout.setting, example_batch)
    params, trace = sizing.params, sizing.trace
    if not params:
        raise ConfigError("the model has no trainable parameters (check adapter.*)")
    optimizer = costs.optimizer_cost(params, layout.setting)
    devices = per_device.sharded_over(layout)
    # In host memory on a CPU device too: training copies it there (optimizer_offload.py)
    # and the tracker counts it in its host pool, not on the device.
    offload = config.memory.optimizer_offload
    state = 0 if offload else per_device.state_bytes(params, layout, optimizer.state_bytes)
    # FSDP2's CPUOffloadPolicy (distributed/host_offload.py): the shards of the weights,
    # their grads and the state live on the host; a gradient is on the device while whole,
    # before its unit's reduce-scatter.
    host_shards = per_device.shards_on_host(layout)
    first_micro_batch, forward, backward = per_device.traced_on_one_device(
        trace, layout, sizing.units)
    step = StepBytes(
        first_micro_batch, forward, backward,
        grads=0 if host_shards else -(-costs.grad_bytes(params) // devices),
        largest_grad=costs.largest_trainable_bytes(params),
        inputs=_inputs_in_step(config.train.gradient_accumulation_steps, sizing, device),
        optimizer=optimizer, devices=devices,
        gathered=per_device.gathers(layout), buckets=per_device.ddp_bucket_bytes(params, layout),
        beside_hook=per_device.beside_hook_bytes(params, layout, sizing.units),
        host_is_device=device == "cpu",
        quantizing=sizing.quantizing)
    peak = moments.peak(moments.step_moments(step, layout.setting, TechniqueOptions.of(config)))
    weights = per_device.sharded_weights(layout, sizing.weight_bytes)
    if host_shards:  # what FSDP2 does not shard stays: buffers
        weights = sizing.weight_bytes - sizing.sharded_bytes
    split = {"weights": weights, "grads": peak.bytes["grads"], "optimizer": state,
             "activations": peak.bytes["activations"], "temporaries": peak.bytes["temporaries"]}
    total = sum(split.values())
    host = trace.host_peak_bytes
    if host_shards:  # process 0's (the largest) shards of every weight (a quantized base's
        # codes and scales too), of the trainable ones' grads, their state and the step's
        # scratch (the step runs on the host)
        rows = per_device.rank_zero_rows(params, devices)
        trainable = sum(p.nbytes for p in params)
        frozen = -(-(sizing.sharded_bytes - trainable) // devices)
        on_host = costs.optimizer_cost(rows, layout.setting)
        host += (frozen + 2 * sum(p.nbytes for p in rows) + on_host.state_bytes
                 + on_host.step_scratch_bytes)
    elif offload:  # state, fp32 host copies of the trainable weights and of their grads,
        # and the scratch of the step, which runs on the host
        host += (optimizer.state_bytes + 2 * 4 * sum(p.numel for p in params)
                 + optimizer.step_scratch_bytes)
    return Estimate(split, total, costs.device_overhead_bytes(total, device), host,
                    config.train.micro_batch_size, config.train.gradient_accumulation_steps,
                    peak, _step_work(config, inputs, sizing, params, devices))


def _step_work(config: Config, inputs: TraceInputs, sizing: _Sizing, params: list[costs.Param],
               devices: int) -> StepWork:
    """The work of one optimizer step on one device: the traced micro-batch's, as many times
    as the step accumulates; the optimizer's (its spec's, over this device's rows under
    FSDP2); what the strategy sends; with optimizer offload, fp32 gradients down and
    weights back up."""
    rows = per_device.rank_zero_rows(params, devices) if devices > 1 else params
    spec, setting = spec_for(config.optimizer), OptimizerSetting.of(config)
    optimizer = spec.step_work(rows, spec.costs(rows, setting), setting)
    offload = config.memory.optimizer_offload
    units = 1 + sizing.sharded_bytes // max(sizing.units.block, 1)  # the blocks and the root
    traffic = strategy_for(config.distributed.strategy).traffic(TrafficSizes(
        costs.grad_bytes(params), sizing.sharded_bytes, units, config.distributed.nproc,
        config.train.gradient_accumulation_steps))
    train = config.train
    # This device's tokens of a micro-batch: a sequence group's processes each take a
    # slice of every sequence (distributed.sequence_parallel).
    slice_length = -(-inputs.tokens.length // inputs.sequence_parallel)
    micro_batch_tokens = (train.micro_batch_size * slice_length
                          if config.model.task in (Task.CAUSAL_LM, Task.SEQUENCE_CLASSIFICATION)
                          and not config.model.factory else None)
    micro_batch = sizing.trace.work
    if spec.backward_work is not None and micro_batch_tokens is not None:
        # Where the optimizer changes backward (GaLore's projected gradients); a factory's
        # tokens per linear layer are unknown, so its backward stays as traced.
        not_done, done = spec.backward_work(params, setting, micro_batch_tokens)
        micro_batch = micro_batch.minus(not_done).plus(done)
    tokens = (None if micro_batch_tokens is None else micro_batch_tokens
              * train.gradient_accumulation_steps * config.distributed.nproc)
    return StepWork(micro_batch, train.gradient_accumulation_steps, optimizer, offload,
                    2 * 4 * sum(p.numel for p in rows) if offload else 0, traffic, tokens)


def _inputs_in_step(accumulation_steps: int, sizing: _Sizing, device: str) -> int:
    """Input bytes alive during optimizer.step(): the step's micro-batches, which on CPU are
    the device's own tensors; elsewhere the last one's device copy."""
    batches = accumulation_steps if device == "cpu" else 1
    return batches * sizing.batch_bytes


def _gathered(module: nn.Module) -> list[torch.Tensor]:
    """What FSDP2 gathers of ``module``: its floating-point parameters, and the quantized
    base's bytes (the stand-in's buffer; in training the packed uint8 parameter of
    techniques.quantized_shards)."""
    return [p for p in module.parameters() if p.is_floating_point()] + [
        layer.quantized for layer in module.modules() if isinstance(layer, QuantizedLinear)]


def _units(model: nn.Module) -> per_device.Units:
    """The largest item of any nn.ModuleList (the repeated blocks FSDP2 gathers one at a
    time) and what is gathered outside them (the root unit)."""
    def sizes(gathered: list[torch.Tensor]) -> tuple[int, int]:
        return (sum(t.numel() * t.element_size() for t in gathered),
                sum(t.numel() * t.element_size() for t in gathered if t.requires_grad))

    blocks = [item for module in model.modules() if isinstance(module, nn.ModuleList)
              for item in module]
    in_blocks = {id(t) for block in blocks for t in _gathered(block)}
    block, block_trainable = max((sizes(_gathered(b)) for b in blocks), default=(0, 0))
    root, root_trainable = sizes([t for t in _gathered(model) if id(t) not in in_blocks])
    return per_device.Units(block, block_trainable, root, root_trainable)


def _sizing(inputs: TraceInputs, setting: OptimizerSetting,
            example_batch: ExampleBatch | None) -> _Sizing:
    # What sizing reads beyond the trace: the optimizer setting (which parameters its spec
    # projects, costs.trainable_params).
    key = (inputs.key, exact_key(setting), _batch_key(example_batch))
    if key not in _SIZING_CACHE:
        model = inputs.build.techniques.model
        transformers_config = meta.hf_config(model)
        full_depth = None if transformers_config is None else meta.depth(transformers_config)
        if full_depth is None or full_depth <= EXACT_DEPTH:
            _SIZING_CACHE[key] = _measure(inputs, setting, None, example_batch)
        else:
            # Each kind of block (checkpointed or not, offloaded or not, frozen or not: the
            # techniques' BlockRules) is measured in stand-ins made of that kind only, and
            # the model is added up kind by kind.
            options = inputs.build.techniques
            kinds = Counter(registry.block_kinds(options, full_depth, blocks.model_named(model)))
            # 2 and 3 layers, not 1 and 2: a 1-layer model's peak can fall in forward (its
            # logits) while deeper ones peak in backward with grads of the layers above,
            # and an increment between two different moments extrapolates to nonsense.
            stand_ins = {kind: inputs.with_memory(registry.all_of_kind(options, kind))
                         for kind in kinds}
            families = [
                _Family(count, *(_measure(stand_ins[kind], setting, layers, example_batch)
                                 for layers in (2, 3)))
                for kind, count in kinds.items()]
            _SIZING_CACHE[key] = _extrapolate(families)
    return _SIZING_CACHE[key]


def _measure(inputs: TraceInputs, setting: OptimizerSetting, layers: int | None,
             example_batch: ExampleBatch | None) -> _Sizing:
    key = (inputs.key, _batch_key(example_batch), layers)
    if key not in _TRACE_CACHE:
        _TRACE_CACHE[key] = _trace(inputs, layers, example_batch)
    traced = _TRACE_CACHE[key]
    params = costs.trainable_params(traced.model, setting)
    return _Sizing(traced.weight_bytes, traced.sharded_bytes, params, traced.trace, traced.units,
                   traced.batch_bytes, traced.quantizing)


def _trace(inputs: TraceInputs, layers: int | None, example_batch: ExampleBatch | None
           ) -> _Traced:
    built = meta.build(inputs.build, layers)
    options = inputs.build.techniques
    weights = costs.weight_bytes(built.model)
    quantizing = quantizing_bytes(built.model, options, inputs.build.device)
    sharded = sum(t.numel() * t.element_size() for t in _gathered(built.model))
    work = workload(inputs, built, example_batch)
    with torch.device("meta"):
        batch_bytes = sum(tensor.numel() * tensor.element_size() for tensor
                          in work.make_batch().values() if isinstance(tensor, torch.Tensor))
    memory = options.memory
    in_blocks = memory.activation_offload and memory.offload_blocks is not None
    with traced_offload_in_blocks() if in_blocks else contextlib.nullcontext():
        trace = trace_micro_batch(built.model, work.make_batch, work.loss_sum,
                                  AUTOCAST_DTYPES.get(options.precision),
                                  memory.activation_offload and not in_blocks)
    if work.exchanges is not None:  # sequence parallelism's all-to-alls, counted as run
        trace = dataclasses.replace(trace, work=dataclasses.replace(
            trace.work, exchanged=work.exchanges.sent_bytes,
            exchanges=work.exchanges.exchanges))
    return _Traced(built.model, weights, sharded, trace, _units(built.model), batch_bytes,
                   quantizing)


@dataclass(frozen=True)
class _Family:
    """``count`` blocks of one kind in the full model, and stand-ins of 2 and 3 such blocks."""

    count: int
    two: _Sizing
    three: _Sizing


def _extrapolate(families: list[_Family]) -> _Sizing:
    """Sizes of the full model from stand-ins of each kind of block: blocks repeat, so
    every quantity is what lies outside the blocks (a family's 2-layer value less two
    increments; the largest, where kinds differ there, e.g. one block's recompute) plus
    each block's increment of its kind. One kind is the plain line through 2 and 3 layers."""
    counts = [family.count for family in families]

    def grow(twos: list[Any], threes: list[Any]) -> Any:
        """Any field: numbers, mappings of them (per key), dataclasses of them (per field,
        so a field added to TraceResult grows too)."""
        first = twos[0]
        if isinstance(first, (int, float)):
            steps = [three - two for two, three in zip(twos, threes, strict=True)]
            outside = max(two - 2 * step for two, step in zip(twos, steps, strict=True))
            return max(0, outside + sum(n * step for n, step in zip(counts, steps, strict=True)))
        if isinstance(first, dict):
            keys = dict.fromkeys(key for split in (*twos, *threes) for key in split)
            return {key: grow([split.get(key, 0) for split in twos],
                              [split.get(key, 0) for split in threes]) for key in keys}
        if dataclasses.is_dataclass(first):
            return dataclasses.replace(first, **{
                field.name: grow([getattr(v, field.name) for v in twos],
                                 [getattr(v, field.name) for v in threes])
                for field in dataclasses.fields(first) if field.init})
        raise TypeError(f"cannot extrapolate a {type(first).__name__} in depth")

    twos, threes = [f.two for f in families], [f.three for f in families]
    # The trainable parameters: outside the blocks, the first kind's 2-layer ones less its
    # two blocks'; then each kind's one block's, once per block of it (a frozen block,
    # memory.freeze_blocks, has none; checkpointing and offload change no weight).
    per_block = [Counter(f.three.params) - Counter(f.two.params) for f in families]
    outside = Counter(families[0].two.params) - Counter(
        {param: 2 * n for param, n in per_block[0].items()})
    params = list(outside.elements()) + [
        param for kind, count in zip(per_block, counts, strict=True)
        for param, n in kind.items() for _ in range(n * count)]
    one = families[0]
    units = [s.units for s in (*twos, *threes)]
    return _Sizing(grow([s.weight_bytes for s in twos], [s.weight_bytes for s in threes]),
                   grow([s.sharded_bytes for s in twos], [s.sharded_bytes for s in threes]),
                   params, grow([s.trace for s in twos], [s.trace for s in threes]),
                   max(units, key=lambda u: u.block), one.two.batch_bytes,
                   # a folder's largest layer repeats in every block; a built model's
                   # layers all exist in full precision at once, and grow with depth
                   grow([s.quantizing for s in twos], [s.quantizing for s in threes]))


def _batch_key(example_batch: ExampleBatch | None) -> tuple | None:
    if example_batch is None:
        return None
    return tuple((name, tuple(t.shape), t.dtype) for name, t in sorted(example_batch.items()))
