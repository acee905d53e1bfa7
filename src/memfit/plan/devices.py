"""Device profiles: how fast a device runs the planner's work (techniques.work), measured
here (``memfit env --calibrate``, calibrate.py) or built in for common GPUs from vendor
figures (``BUILTIN``; docs/planner.md lists them and their sources).

A profile holds throughput tables by the size of one call (a 64 x 64 matmul runs at a
small fraction of a large one's rate), a per-op host cost (Python, autograd and the
dispatcher; on CUDA also the kernel launch), the host link (activation and optimizer
offload) and the interconnect (DDP/FSDP collectives). A calibrated profile is cached as
JSON in the user's cache folder per device, torch version and CPU thread count; it is
data: read back field by field and validated, never executed.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from memfit._utils.errors import ConfigError
from memfit.config.devices import DATASHEETS, Datasheet

GIB = 2**30
# (size of one call, throughput at that size): FLOPs and FLOP/s, or bytes and bytes/s;
# sorted by size, interpolated log-linearly between points (rates.py).
Table = tuple[tuple[float, float], ...]
# A profile file to use for this machine's device instead of its calibration (a machine
# whose plans must not swing with its load: CI).
PROFILE_ENV = "MEMFIT_DEVICE_PROFILE"
PROFILE_VERSION = 5  # of the cache's format: a cache of another version is measured again
CACHE_ENV = "MEMFIT_CACHE_DIR"


@dataclass(frozen=True)
class DeviceProfile:
    name: str  # "cpu", "nvidia-h100-80gb-hbm3", or a builtin's key ("h100")
    source: str  # "calibrated" or "builtin"
    matmul: dict[str, Table]  # compute dtype name -> FLOP/s by a product's smallest side
    memory: Table  # bytes/s by bytes moved per call
    op_seconds: float  # host time per op dispatched
    host_link: float  # bytes/s device <-> host (pinned copies; a memcpy on CPU)
    host_memory: float  # bytes/s of the host's own memory (an optimizer step offloaded there)
    host_flops: float  # FLOP/s of the host's fp32 matmuls and factorizations (GaLore's SVD)
    interconnect: float  # bytes/s each process sends in a collective (ring algorithms)
    collective_seconds: float  # the fixed latency of one collective
    asynchronous: bool  # ops are queued while the device works (CUDA): host time overlaps
    memory_bytes: int | None = None  # the device's memory (a builtin's budget default)
    note: str = ""  # where the figures come from
    # op name -> seconds per value written beyond the op's bytes (calibrate.ARITHMETIC:
    # ops a CPU computes slower than it moves their bytes); none for a GPU's builtin
    element_seconds: dict[str, float] = field(default_factory=dict)
    # 16-bit float dtype name -> bytes/s of element-wise ops in it by bytes moved per call
    # (a CPU computes them at fp32's time per value); none: ``memory`` for every dtype
    memory_by_dtype: dict[str, Table] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"version": PROFILE_VERSION, "name": self.name, "source": self.source,
                "matmul": {dtype: [list(point) for point in table]
                           for dtype, table in self.matmul.items()},
                "memory": [list(point) for point in self.memory],
                "op_seconds": self.op_seconds, "host_link": self.host_link,
                "host_memory": self.host_memory, "host_flops": self.host_flops,
                "interconnect": self.interconnect,
                "collective_seconds": self.collective_seconds,
                "asynchronous": self.asynchronous, "memory_bytes": self.memory_bytes,
                "note": self.note, "element_seconds": dict(self.element_seconds),
                "memory_by_dtype": {dtype: [list(point) for point in table]
                                    for dtype, table in self.memory_by_dtype.items()}}


def _ramp(peak: float, half_size: float, sizes: range) -> Table:
    """A builtin's table: ``peak`` approached as calls grow, half of it at ``half_size``
    (fixed per-call costs: tiles that do not fill the device, memory latency)."""
    return tuple((2.0**k, peak * 2.0**k / (2.0**k + half_size)) for k in sizes)


# Matmuls by their smallest dimension (work_count): half the peak at 256 (a 4096 x 256
# x 4096 product fills a large GPU's tensor cores about half); memory ops by bytes per
# call: half the bandwidth at 1 MiB (launch and latency of a short kernel).
_SIDES, _BYTES = range(0, 16), range(10, 36, 2)


# Achieved / datasheet: large GEMMs in cuBLAS reach 60-75% of the tensor-core peak, and
# streaming kernels ~80% of the memory bandwidth (NVIDIA's and others' published
# measurements); pinned PCIe copies ~80% of the link; NCCL's ring bus bandwidth ~70%.
MATMUL_EFFICIENCY, BANDWIDTH_EFFICIENCY, LINK_EFFICIENCY, COLLECTIVE_EFFICIENCY = (
    0.65, 0.8, 0.8, 0.7)
# Eager PyTorch's host cost per op in a training step (Python, autograd, dispatch, launch).
GPU_OP_SECONDS = 10e-6
# An offloaded optimizer step runs on the host CPU with torch ops: a server's memory
# bandwidth as a few threads reach it, and a fraction of its cores' fp32 peak.
GPU_HOST_MEMORY, GPU_HOST_FLOPS = 20e9, 200e9
# NCCL's latency per collective within a node (tens of microseconds); gloo's on one CPU host
# (its TCP loopback and a thread hand-off per call: hundreds).
NCCL_SECONDS, GLOO_SECONDS = 30e-6, 300e-6

# Planning for cuda where no GPU is here: the profile assumed (a common 24 GB card).
ASSUMED_GPU = "rtx-4090"


def _builtin(key: str, sheet: Datasheet) -> DeviceProfile:
    tera, giga = 1e12, 1e9
    # Without bf16 tensor cores (T4), bf16 matmuls run on the CUDA cores.
    peaks = {"float32": sheet.fp32_tflops, "float16": sheet.fp16_tflops,
             "bfloat16": sheet.bf16_tflops or sheet.fp32_tflops}
    matmul = {dtype: _ramp(peak * tera * MATMUL_EFFICIENCY, 256, _SIDES)
              for dtype, peak in peaks.items()}
    bandwidth = sheet.bandwidth_gbs * giga * BANDWIDTH_EFFICIENCY
    return DeviceProfile(
        key, "builtin", matmul, _ramp(bandwidth, 2**20, _BYTES), GPU_OP_SECONDS,
        sheet.host_link_gbs * giga * LINK_EFFICIENCY, GPU_HOST_MEMORY, GPU_HOST_FLOPS,
        sheet.interconnect_gbs * giga * COLLECTIVE_EFFICIENCY, NCCL_SECONDS, True,
        int(sheet.memory_gib * GIB),
        f"{sheet.label}: {sheet.source}; matmul x{MATMUL_EFFICIENCY}, memory "
        f"x{BANDWIDTH_EFFICIENCY}, host link x{LINK_EFFICIENCY}, collectives "
        f"x{COLLECTIVE_EFFICIENCY} of the datasheet")


BUILTIN: dict[str, DeviceProfile] = {key: _builtin(key, sheet)
                                     for key, sheet in DATASHEETS.items()}


def builtin(name: str) -> DeviceProfile:
    """A builtin profile by name (--device NAME); a ConfigError naming the choices."""
    if name not in BUILTIN:
        raise ConfigError(f"--device {name!r} is not one of: cuda, cpu, {', '.join(BUILTIN)}")
    return BUILTIN[name]


def datasheet_rows() -> list[tuple[str, str, str]]:
    """(name, what the figures are, source) per builtin profile: docs/planner.md's list."""
    rows = []
    for key, sheet in DATASHEETS.items():
        bf16 = f"{sheet.bf16_tflops:g}" if sheet.bf16_tflops else "-"
        rows.append((key, f"{sheet.label}: bf16 {bf16} / fp16 {sheet.fp16_tflops:g} / fp32 "
                          f"{sheet.fp32_tflops:g} TFLOPS, {sheet.bandwidth_gbs:g} GB/s, host "
                          f"link {sheet.host_link_gbs:g} GB/s, interconnect "
                          f"{sheet.interconnect_gbs:g} GB/s", sheet.source))
    return rows


# ---- the local device's calibrated profile -----------------------------------------------

def local_name(device: str) -> str:
    """What a calibration of ``device`` ("cpu" or "cuda") is filed under."""
    if device == "cuda":
        return torch.cuda.get_device_name(0).lower().replace(" ", "-")
    return "cpu"


def cache_path(device: str) -> Path:
    """The cache file of this machine's ``device`` for this torch and thread count."""
    root = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "memfit")
    threads = f"-threads{torch.get_num_threads()}" if device == "cpu" else ""
    return (Path(root) / "devices"
            / f"{local_name(device)}-torch{torch.__version__}{threads}.json")


def read_cached(path: Path, device: str) -> DeviceProfile | None:
    """The profile cached at ``path``, or None when there is none (or it is of another
    format version); a ConfigError naming the file when it is damaged or was written for
    another device."""
    if not path.exists():
        return None
    fix = "delete it or run `memfit env --calibrate` to measure this machine again"
    try:
        data = json.loads(path.read_text())
        if isinstance(data, dict) and isinstance(data.get("version"), int) and (
                data["version"] != PROFILE_VERSION):
            return None  # written by another memfit release: calibrate again
        profile = _profile_from(data)
    except (OSError, ValueError, KeyError, TypeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ConfigError(f"calibration cache {path} is damaged ({reason}); {fix}") from None
    if profile.name != local_name(device) or profile.source != "calibrated":
        raise ConfigError(f"calibration cache {path} is for {profile.name!r} "
                          f"({profile.source}), not this machine's {local_name(device)!r}; {fix}")
    return profile


def _profile_from(data: Any) -> DeviceProfile:
    """A DeviceProfile from its JSON, every field checked (ValueError / KeyError /
    TypeError on anything else)."""
    if not isinstance(data, dict) or data.get("version") != PROFILE_VERSION:
        raise ValueError(f"not a version-{PROFILE_VERSION} device profile")
    matmul = data["matmul"]
    if not isinstance(matmul, dict) or not matmul:
        raise ValueError("matmul: expected a table per dtype")
    memory_bytes = data["memory_bytes"]
    if memory_bytes is not None and (not isinstance(memory_bytes, int) or memory_bytes <= 0):
        raise ValueError("memory_bytes: expected a positive integer or null")
    if not isinstance(data["asynchronous"], bool):
        raise ValueError("asynchronous: expected true or false")
    elements = data["element_seconds"]
    if not isinstance(elements, dict) or len(elements) > 64:
        raise ValueError("element_seconds: expected a mapping of op names to seconds")
    by_dtype = data["memory_by_dtype"]
    if not isinstance(by_dtype, dict) or len(by_dtype) > 8:
        raise ValueError("memory_by_dtype: expected a table per dtype")
    return DeviceProfile(
        _text(data["name"], "name"), _text(data["source"], "source"),
        {_text(dtype, "matmul dtype"): _table(table, f"matmul.{dtype}")
         for dtype, table in matmul.items()},
        _table(data["memory"], "memory"), _positive(data["op_seconds"], "op_seconds"),
        _positive(data["host_link"], "host_link"), _positive(data["host_memory"], "host_memory"),
        _positive(data["host_flops"], "host_flops"),
        _positive(data["interconnect"], "interconnect"),
        _positive(data["collective_seconds"], "collective_seconds"), data["asynchronous"],
        memory_bytes,
        _text(data["note"], "note", allow_empty=True),
        {_text(op, "element_seconds op"): _positive(seconds, f"element_seconds.{op}", zero=True)
         for op, seconds in elements.items()},
        {_text(dtype, "memory_by_dtype dtype"): _table(table, f"memory_by_dtype.{dtype}")
         for dtype, table in by_dtype.items()})


def _text(value: Any, key: str, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not allow_empty) or len(value) > 500:
        raise ValueError(f"{key}: expected a short string")
    return value


def _positive(value: Any, key: str, zero: bool = False) -> float:
    """``value`` as a float: a finite number above 0 (or 0 too, with ``zero``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and (value > 0 or zero and value == 0)):
        wanted = "a number >= 0" if zero else "a positive number"
        raise ValueError(f"{key}: expected {wanted}, got {value!r}")
    return float(value)


def _table(value: Any, key: str) -> Table:
    if not isinstance(value, list) or not value or len(value) > 64:
        raise ValueError(f"{key}: expected a list of [size, rate] points")
    points = tuple((_positive(point[0], key), _positive(point[1], key))
                   for point in value if isinstance(point, list) and len(point) == 2)
    if len(points) != len(value) or list(points) != sorted(points):
        raise ValueError(f"{key}: expected [size, rate] points sorted by size")
    return points
