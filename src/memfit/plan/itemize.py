"""One configuration -> itemized bytes at its peak.

    weights      distinct parameter + buffer storages of the meta model (techniques applied)
    grads        trainable parameters' gradients, as many as are alive at the peak
    optimizer    optimizer state (costs.py); in host memory with memory.optimizer_offload
    activations  saved for backward (traced, trace.py)
    temporaries  everything else alive at the peak: in-flight forward values, gradients of
                 activations, optimizer-step scratch

The training step has three candidate peaks, and the estimate is the largest:
1. the first micro-batch's forward + backward (traced; grads appear as backward runs);
2. a later micro-batch when accumulating: every grad already exists, plus the one being
   added (``peak_without_grads`` of the trace + all grads + the largest grad);
3. ``optimizer.step()``: weights + grads + state + the step's scratch.
Layer-wise updates (optimizer.layerwise) replace 1-3 by: the trace without grads + the one
grad being consumed + one parameter's step scratch + accumulation buffers.

Hugging Face models deeper than ``EXACT_DEPTH`` are built (on meta) and traced with 1 and 2
layers, and every quantity — weights, the trainable parameters, the traced bytes — is
extrapolated linearly in depth (the blocks repeat), so a 70B model is planned in seconds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from memfit._utils.errors import ConfigError
from memfit.config.schema import Config, Precision, Task
from memfit.models.load import import_object
from memfit.models.loss import causal_lm_loss_sum
from memfit.plan import costs, meta
from memfit.plan.trace import TraceResult, trace_micro_batch

EXACT_DEPTH = 4
CATEGORIES: tuple[str, ...] = ("weights", "grads", "optimizer", "activations", "temporaries")
AUTOCAST = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}


@dataclass(frozen=True)
class Estimate:
    """Bytes of one configuration; ``bytes`` is split at the peak and sums to it.
    ``to_json`` is the "E" of the documented --json schema, exactly."""

    bytes: dict[str, int]
    peak_tensor_bytes: int
    device_overhead_bytes: int
    host_bytes: int
    micro_batch_size: int
    gradient_accumulation_steps: int
    notes: tuple[str, ...] = field(default=())

    @property
    def device_bytes(self) -> int:
        return self.peak_tensor_bytes + self.device_overhead_bytes

    def to_json(self) -> dict[str, Any]:
        return {"bytes": dict(self.bytes), "peak_tensor_bytes": self.peak_tensor_bytes,
                "device_overhead_bytes": self.device_overhead_bytes,
                "host_bytes": self.host_bytes}


ExampleBatch = dict[str, torch.Tensor]


@dataclass(frozen=True)
class _Sizing:
    """What the model itself decides: weights, trainable parameters, one micro-batch."""

    weight_bytes: int
    params: list[costs.Param]
    trace: TraceResult


_SIZING_CACHE: dict[tuple, _Sizing] = {}


def estimate(config: Config, device: str = "cuda",
             example_batch: ExampleBatch | None = None) -> Estimate:
    """Itemized bytes of training with ``config`` (see the module docstring)."""
    sizing = _sizing(config, example_batch)
    params, trace = sizing.params, sizing.trace
    if not params:
        raise ConfigError("the model has no trainable parameters (check adapter.*)")
    optimizer = costs.optimizer_cost(params, config)
    grads = costs.grad_bytes(params)
    largest = costs.largest_trainable_bytes(params)
    offload = config.memory.optimizer_offload
    state = 0 if offload else optimizer.state_bytes
    with_grads, without = trace.peak, trace.peak_without_grads
    if config.optimizer.layerwise:
        candidates = [
            {"grads": largest, "activations": without["activations"],
             "temporaries": without["temporaries"] + optimizer.per_param_scratch_bytes
             + optimizer.accumulation_buffer_bytes}]
    else:
        candidates = [{"grads": with_grads["grads"], "activations": with_grads["activations"],
                       "temporaries": with_grads["temporaries"]},
                      {"grads": grads, "activations": 0,
                       "temporaries": 0 if offload else optimizer.step_scratch_bytes}]
        if config.train.gradient_accumulation_steps > 1:
            candidates.append({"grads": grads, "activations": without["activations"],
                               "temporaries": without["temporaries"] + largest})
    peak = max(candidates, key=lambda c: sum(c.values()))
    split = {"weights": sizing.weight_bytes, "grads": peak["grads"], "optimizer": state,
             "activations": peak["activations"], "temporaries": peak["temporaries"]}
    total = sum(split.values())
    host = trace.host_peak_bytes
    if offload:  # state, fp32 host copies of the trainable weights and of their grads
        host += optimizer.state_bytes + 2 * 4 * sum(p.numel for p in params)
    return Estimate(split, total, costs.device_overhead_bytes(total, device), host,
                    config.train.micro_batch_size, config.train.gradient_accumulation_steps)


def _sizing(config: Config, example_batch: ExampleBatch | None) -> _Sizing:
    key = (config.model, config.adapter, config.precision, config.memory,
           config.train.micro_batch_size, config.data.max_length, _batch_key(example_batch))
    if key not in _SIZING_CACHE:
        transformers_config = meta.hf_config(config)
        full_depth = None if transformers_config is None else meta.depth(transformers_config)
        if full_depth is None or full_depth <= EXACT_DEPTH:
            _SIZING_CACHE[key] = _measure(config, None, example_batch)
        else:
            one, two = (_measure(config, layers, example_batch) for layers in (1, 2))
            _SIZING_CACHE[key] = _extrapolate(one, two, full_depth - 1)
    return _SIZING_CACHE[key]


def _measure(config: Config, layers: int | None, example_batch: ExampleBatch | None
             ) -> _Sizing:
    built = meta.build(config, layers)
    weights = costs.weight_bytes(built.model)
    params = costs.trainable_params(built.model)
    make_batch, loss_sum = _workload(config, built, example_batch)
    trace = trace_micro_batch(built.model, make_batch, loss_sum, AUTOCAST.get(config.precision),
                              config.memory.activation_offload)
    return _Sizing(weights, params, trace)


def _extrapolate(one: _Sizing, two: _Sizing, extra_layers: int) -> _Sizing:
    """Sizes of a model ``extra_layers`` deeper than ``one``, from one layer's increment
    (``two`` - ``one``): blocks repeat, so every quantity grows linearly in depth."""

    def grow(a: int, b: int) -> int:
        return max(0, a + (b - a) * extra_layers)

    def grow_split(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
        return {key: grow(a[key], b[key]) for key in a}

    per_layer = Counter(two.params) - Counter(one.params)
    params = list(one.params) + [p for p, n in per_layer.items() for _ in range(n * extra_layers)]
    trace = TraceResult(grow_split(one.trace.peak, two.trace.peak),
                        grow_split(one.trace.peak_without_grads, two.trace.peak_without_grads),
                        grow(one.trace.host_peak_bytes, two.trace.host_peak_bytes))
    return _Sizing(grow(one.weight_bytes, two.weight_bytes), params, trace)


def _batch_key(example_batch: ExampleBatch | None) -> tuple | None:
    if example_batch is None:
        return None
    return tuple((name, tuple(t.shape), t.dtype) for name, t in sorted(example_batch.items()))


def _workload(config: Config, built: meta.MetaModel, example_batch: ExampleBatch | None):
    """(make_batch, loss_sum) as the training loop would run them."""
    if config.model.task is Task.CAUSAL_LM and built.is_transformers:
        shape = (config.train.micro_batch_size, config.data.max_length)

        def make_batch() -> dict[str, Any]:
            # attention_mask None: an all-ones mask (packed text), which transformers drops.
            return {"input_ids": torch.zeros(shape, dtype=torch.long),
                    "labels": torch.zeros(shape, dtype=torch.long), "attention_mask": None}

        if config.memory.chunked_loss:
            from memfit.techniques import chunked_loss

            chunk_tokens = config.memory.loss_chunk_tokens
            return make_batch, lambda model, batch: chunked_loss.causal_lm_loss_sum(
                model, batch, chunk_tokens)
        return make_batch, causal_lm_loss_sum
    if example_batch is None:
        raise ConfigError("planning a model.factory model needs one example micro-batch: "
                          "pass example_batch={name: tensor} to memfit.plan")
    loss_function = import_object(config.model.loss, "model.loss") if config.model.loss else None

    def make_factory_batch() -> dict[str, Any]:
        return {name: torch.empty(tensor.shape, dtype=tensor.dtype)
                for name, tensor in example_batch.items()}

    def loss_sum(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        outputs = model(**batch)
        if loss_function is not None:
            return loss_function(outputs, batch)
        return outputs if isinstance(outputs, torch.Tensor) else outputs.loss

    return make_factory_batch, loss_sum


