"""``memfit env --calibrate``: measure this machine's device for the planner's time model
(devices.DeviceProfile) in a few seconds, and cache it.

- matmul: (L x s) @ (s x L) products per compute dtype, s from 4 to L = 1024 (CPU) or
  from 8 to L = 8192 (CUDA): the rate by a product's smallest dimension;
- memory: an element-wise add of 4 KiB to 128 MiB moved (two reads, one write), in fp32
  and in bf16 (a CPU adds bf16 values at fp32's time per value, on half the bytes);
- the host link: a 64 MiB copy each way (pinned on CUDA; on CPU the memcpy offload does);
- per value, ops whose arithmetic rather than their bytes may set their time
  (``ARITHMETIC``: dropout's random draws, tanh, exp, ...) on 2^20 fp32 values: what an op
  took beyond its bytes at the memory table's rate, per value it wrote; and the same for
  bitsandbytes' 8-bit AdamW step per parameter value (its Passes' bytes priced);
- the host cost per op: a training step of transformers' Llama at its smallest (hidden 64,
  2 layers, 16 tokens), whose ops are counted as the planner counts them
  (work_count.WorkCount): what the step took beyond its device work, per op.

Each timing is the median of repeated runs (after one warm-up), less the time of an empty
op for the tables, so sizes the device does quickly are not all overhead.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from memfit._utils.atomic import write_text
from memfit.plan.devices import (
    GLOO_SECONDS,
    GPU_HOST_FLOPS,
    GPU_HOST_MEMORY,
    NCCL_SECONDS,
    DeviceProfile,
    Table,
    cache_path,
    local_name,
)
from memfit.plan.work_count import WorkCount

_REPEAT_SECONDS = 0.05  # each measurement repeats for about this long
# A matmul slower than this stops the table's growth: where a dtype runs this slowly (bf16
# on a CPU without AVX512-BF16: 0.9 GFLOP/s against fp32's 160 on an AVX2 EPYC, each
# 1024 x 1024 x 1024 product 2.4 s), the larger sides take its rate (rates only grow
# with the side, so their time is not under-predicted), instead of 17 s of products.
_SLOW_PRODUCT_SECONDS = 0.1
# Op name (as work_count files it) -> a call of it on a tensor of values. The draws of
# dropout's mask (bernoulli_), the tanh of tanh-approximated GELU (GPT-2 and others) and
# its backward, exp, and the activations and softmax transformers' models run.
ARITHMETIC: dict[str, Callable[[torch.Tensor], object]] = {
    "bernoulli_": lambda x: x.bernoulli_(0.9),
    "tanh": torch.tanh,
    "tanh_backward": lambda x: torch.ops.aten.tanh_backward(x, x),
    "exp": torch.exp,
    "silu": torch.nn.functional.silu,
    "gelu": torch.nn.functional.gelu,
    "_softmax": lambda x: torch.softmax(x.view(1024, -1), dim=-1),
}


def calibrate(device: str) -> DeviceProfile:
    """Measure ``device`` ("cpu", or "cuda": the first GPU) now."""
    target = torch.device(device)
    sync = torch.cuda.synchronize if target.type == "cuda" else (lambda: None)
    empty = _seconds(lambda: torch.empty(0, device=target), sync)
    if target.type == "cuda":
        sides, dtypes = (8, 32, 128, 512, 2048, 8192), ("float32", "bfloat16", "float16")
    else:
        sides, dtypes = (4, 8, 16, 32, 64, 128, 256, 512, 1024), ("float32", "bfloat16")
    matmul = {dtype: _matmul_table(target, getattr(torch, dtype), sides, empty, sync)
              for dtype in dtypes}
    memory = _memory_table(target, empty, sync, torch.float32)
    by_dtype = {"bfloat16": _memory_table(target, empty, sync, torch.bfloat16)}
    host_link = _host_link(target, sync)
    on_cpu = target.type == "cpu"
    host_memory = memory[-1][1] if on_cpu else GPU_HOST_MEMORY
    host_flops = matmul["float32"][-1][1] if on_cpu else GPU_HOST_FLOPS
    collective = GLOO_SECONDS if on_cpu else NCCL_SECONDS
    partial = DeviceProfile(local_name(device), "calibrated", matmul, memory, 0.0, host_link,
                            host_memory, host_flops, host_link, collective, not on_cpu)
    op_seconds = _op_seconds(partial, target, sync)
    elements = {**_element_seconds(partial, target, empty, sync),
                **_optimizer_seconds(partial, target, empty, sync)}
    memory_bytes = None if on_cpu else torch.cuda.get_device_properties(0).total_memory
    threads = f", {torch.get_num_threads()} threads" if on_cpu else ""
    return DeviceProfile(partial.name, "calibrated", matmul, memory, op_seconds, host_link,
                         host_memory, host_flops, host_link, collective, partial.asynchronous,
                         memory_bytes,
                         f"measured by memfit env --calibrate (torch {torch.__version__}"
                         f"{threads}); collectives assumed at the host link's rate",
                         elements, by_dtype)


def calibrate_and_cache(device: str) -> tuple[DeviceProfile, Path, float]:
    """(profile, the cache file it was written to, seconds the measurement took)."""
    import json

    started = time.perf_counter()
    profile = calibrate(device)
    path = cache_path(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(profile.to_json(), indent=1))
    return profile, path, time.perf_counter() - started


def _seconds(run: Callable[[], object], sync: Callable[[], None]) -> float:
    """Median seconds of ``run`` over about _REPEAT_SECONDS (at least 3 runs)."""
    run()
    sync()
    times: list[float] = []
    spent = 0.0
    while len(times) < 3 or spent < _REPEAT_SECONDS:
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
        spent += times[-1]
        if len(times) >= 200:
            break
    return statistics.median(times)


def _rate(amount: float, seconds: float, empty: float) -> float:
    # Less an empty op's time (the host cost is priced per op apart), never below a tenth.
    return amount / max(seconds - empty, seconds / 10)


def _matmul_table(target: torch.device, dtype: torch.dtype, sides: tuple[int, ...],
                  empty: float, sync: Callable[[], None]) -> Table:
    """FLOP/s by the product's smallest dimension (work_count's size of a matmul): an
    (L x s) @ (s x L) product for each side s, L the largest side; sides past a product
    slower than _SLOW_PRODUCT_SECONDS take its rate."""
    points: list[tuple[float, float]] = []
    long = sides[-1]
    seconds = 0.0
    for side in sides:
        if seconds > _SLOW_PRODUCT_SECONDS:
            points.append((float(side), points[-1][1]))
            continue
        a = torch.randn(long, side, device=target).to(dtype)
        b = torch.randn(side, long, device=target).to(dtype)
        flops = 2 * long * side * long
        seconds = _seconds(lambda a=a, b=b: a @ b, sync)
        points.append((float(side), _rate(flops, seconds, empty)))
    return tuple(points)


def _memory_table(target: torch.device, empty: float, sync: Callable[[], None],
                  dtype: torch.dtype) -> Table:
    points = []
    per_add = 3 * dtype.itemsize  # three tensors moved per value: two read, one written
    for moved_log2 in range(12, 28, 2):
        elements = 2**moved_log2 // per_add
        a, b = (torch.ones(elements, device=target, dtype=dtype) for _ in range(2))
        out = torch.empty_like(a)
        moved = per_add * elements
        add = _seconds(lambda a=a, b=b, out=out: torch.add(a, b, out=out), sync)
        points.append((float(moved), _rate(moved, add, empty)))
    return tuple(points)


def _host_link(target: torch.device, sync: Callable[[], None]) -> float:
    """Bytes of a tensor copied device -> host (or back) per second."""
    nbytes = 64 * 2**20
    source = torch.ones(nbytes // 4, device=target)
    host = torch.empty(nbytes // 4, pin_memory=target.type == "cuda")
    down = _seconds(lambda: host.copy_(source, non_blocking=True), sync)
    up = _seconds(lambda: source.copy_(host, non_blocking=True), sync)
    return nbytes / ((down + up) / 2)


def _element_seconds(profile: DeviceProfile, target: torch.device, empty: float,
                     sync: Callable[[], None]) -> dict[str, float]:
    """Op name -> seconds per value written beyond the op's bytes (module docstring); the
    bytes as work_count counts them, priced by ``profile``'s memory table."""
    from memfit.plan.step_time import device_seconds

    measured = {}
    for name, call in ARITHMETIC.items():
        values = torch.randn(2**20, device=target)
        counting = _Counting()
        with counting:
            call(values)
        work = counting.work.result()
        seconds = _seconds(lambda call=call, values=values: call(values), sync) - empty
        measured[name] = _per_value(seconds, device_seconds(work, profile),
                                    work.amounts[("elements", name, 0)])
    return measured


def _optimizer_seconds(profile: DeviceProfile, target: torch.device, empty: float,
                       sync: Callable[[], None]) -> dict[str, float]:
    """Update name -> seconds per parameter value of its step beyond the bytes its
    Passes count, on one 1024 x 1024 fp32 weight."""
    from memfit.optim.adamw8bit import AdamW8bit
    from memfit.plan.step_time import device_seconds
    from memfit.techniques.optimizers.step_work import ADAMW8BIT

    weight = torch.nn.Parameter(torch.randn(1024, 1024, device=target))
    weight.grad = torch.randn_like(weight)
    optimizer = AdamW8bit([weight], lr=1e-3)
    seconds = _seconds(optimizer.step, sync) - empty
    counted = device_seconds(ADAMW8BIT.of(weight.numel()), profile)
    return {ADAMW8BIT.arithmetic: _per_value(seconds, counted, weight.numel())}


def _per_value(seconds: float, counted: float, values: int) -> float:
    """Seconds per value beyond what the profile already prices (never below 0)."""
    return max(0.0, seconds - counted) / values


class _Counting(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.work = WorkCount()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.work.count(func, args, kwargs, out)
        return out


def _op_seconds(profile: DeviceProfile, target: torch.device,
                sync: Callable[[], None]) -> float:
    """Host seconds per op of a real training step (module docstring)."""
    from transformers import LlamaForCausalLM

    from memfit.models.presets import tiny_llama
    from memfit.plan.step_time import device_seconds

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama()).to(target)
    ids = torch.randint(3, 200, (1, 16), device=target)

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()

    counting = _Counting()
    with counting:
        step()
    work = counting.work.result()
    seconds = _seconds(step, sync)
    return max(seconds - device_seconds(work, profile), seconds / 10) / work.launches
