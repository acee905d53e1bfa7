"""What ``memfit env`` reports: versions, devices, and which optional backends actually
work on this machine (each is tried for real on a tiny tensor, not guessed).

Every installed package is imported for real, each import guarded (every exception, not
only ImportError), and all of it in a child process: a library that kills or hangs the
interpreter on import costs that child, which is started again without that step, and
``memfit env`` itself imports none of them. An unpinned ``pip install timm`` or
``torchvision`` can replace the torch build or bring a torchvision compiled against another
torch, whose import then fails (``RuntimeError: operator torchvision::nms does not
exist``), and everything that imports it fails with it: transformers imports torchvision
itself when it is installed. The broken library's row is the one line every other command
prints for it (``memfit._utils.broken_imports.broken_line``): it, the last line of what it
raised, and the reinstall that pins this torch; the rows that need it say they are
unavailable and why."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import platform
import sys
from collections.abc import Callable
from functools import partial

from memfit._utils.broken_imports import (
    ImportFailure,
    broken_line,
    died,
    failure_of,
    import_each,
    last_line,
    report,
    run_child,
)

# Beside memfit's own dependencies, the libraries a model.factory commonly imports.
PACKAGES = ["memfit", "torch", "transformers", "peft", "bitsandbytes", "datasets",
            "safetensors", "tensorboard", "accelerate", "gguf", "torchvision", "timm"]


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _status(package: str, failure: ImportFailure | None, shown: set[str]) -> str:
    """A package's row: its version, or the broken-library line (its own, or the one that
    breaks it, unless that one's own row, in ``shown``, has it)."""
    version = _version(package)
    if version == "not installed" or failure is None:
        return version
    if failure.culprit == package:
        return broken_line(failure)
    if failure.culprit in shown:
        return f"{version}, but it does not import: {failure.culprit} does not (see its row)"
    return f"{version}, but it does not import: {broken_line(failure)}"


def package_status(package: str) -> str:
    """The version of an installed package that imports (in a fresh interpreter); ``not
    installed``; or the line naming the library that breaks its import and its reinstall."""
    if _version(package) == "not installed":
        return "not installed"
    return _status(package, import_each([package])[package], set())


def _works(probe: Callable[[], object]) -> str:
    try:
        probe()
    except Exception as error:  # noqa: BLE001 -- any failure of the probe is its answer
        return f"no ({last_line(error)})"
    return "yes"


def _bnb_4bit(device: str) -> None:
    import bitsandbytes.functional as bnbf
    import torch

    weights = torch.randn(64, 64, device=device)
    packed, state = bnbf.quantize_4bit(weights, quant_type="nf4")
    bnbf.dequantize_4bit(packed, state)


def _bnb_8bit_optimizer(device: str) -> None:
    import bitsandbytes as bnb
    import torch

    parameter = torch.nn.Parameter(torch.randn(64, 64, device=device))
    parameter.grad = torch.randn_like(parameter)
    bnb.optim.AdamW8bit([parameter]).step()


def _cpu_bf16_autocast() -> None:
    import torch

    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.randn(8, 8) @ torch.randn(8, 8)


def _presets() -> str:
    from memfit.models.presets import PRESETS, preset_names

    # The language presets import transformers only when one is built (and transformers
    # may import a broken torchvision): build one, so that this row says when they cannot.
    PRESETS["tiny-llama"]()
    return ", ".join(preset_names())


def _optimizers() -> str:
    from memfit.techniques.optimizers import SPECS

    return ", ".join(SPECS) + ", or a class path package.module:Class"


class _Rows:
    """The rows, each computed as one guarded step that is reported before the next one
    starts (to ``describe``'s parent when in a child); a step that killed an earlier child
    is in ``skipped`` with why, and is answered with that instead of run again."""

    def __init__(self, skipped: dict[str, str], reporting: bool) -> None:
        self.skipped, self.reporting, self.rows = skipped, reporting, []
        self.failures: dict[str, ImportFailure | None] = {}

    def add(self, name: str, value: str) -> None:
        self.rows.append((name, value))
        if self.reporting:
            report({"name": name, "value": value})

    def start(self, step: str) -> str | None:
        if self.reporting:
            report({"start": step})
        return self.skipped.get(step)

    def imports(self, package: str) -> ImportFailure | None:
        reason = self.start(package)
        if reason is not None:
            return ImportFailure(package, package, reason)
        try:
            importlib.import_module(package)
        except BaseException as error:  # noqa: BLE001 -- SystemExit too: all are answers
            return failure_of(package, error)
        return None

    def unavailable(self, needs: list[str]) -> str | None:
        """Why a row cannot be computed: the first package it needs that does not import."""
        broken = [package for package in needs if self.failures.get(package) is not None]
        return f"unavailable: {broken[0]} does not import" if broken else None

    def probe(self, name: str, probe: Callable[[], object], needs: list[str]) -> None:
        reason = self.start(name)
        self.add(name, self.unavailable(needs) or (f"no ({reason})" if reason else _works(probe)))

    def registry(self, name: str, module: str, value: Callable[[], str]) -> None:
        reason = self.start(name)
        if reason is not None:
            self.add(name, f"unavailable ({reason})")
            return
        try:
            self.add(name, value())
        except Exception as error:  # noqa: BLE001 -- a broken library is this row's answer
            failure = failure_of(module, error)
            if failure.culprit == "memfit":  # no library to blame: memfit's own bug
                self.add(name, f"unavailable ({failure.last_line})")
            elif failure.culprit in self.shown():
                self.add(name, f"unavailable: {failure.culprit} does not import (see its row)")
            else:
                self.add(name, f"unavailable: {broken_line(failure)}")

    def shown(self) -> set[str]:
        """The packages whose own row is the line saying that they are broken."""
        return {package for package, failure in self.failures.items()
                if failure is not None and failure.culprit == package}


def describe_here(skipped: dict[str, str] | None = None, reporting: bool = False,
                  ) -> list[tuple[str, str]]:
    """The rows, computed in this process (every step guarded)."""
    rows = _Rows(skipped or {}, reporting)
    rows.add("python", platform.python_version())
    rows.add("platform", platform.platform())
    installed = [package for package in PACKAGES if _version(package) != "not installed"]
    first: dict[str, str] = {}  # a culprit's last line as it failed first: a retry may differ
    for package in installed:
        failure = rows.imports(package)
        if failure is not None:
            failure = ImportFailure(package, failure.culprit,
                                    first.setdefault(failure.culprit, failure.last_line))
        rows.failures[package] = failure
    for package in PACKAGES:
        rows.add(package, _status(package, rows.failures.get(package), rows.shown()))
    if "torch" not in installed or rows.failures["torch"] is not None:
        rows.add("devices and backends", "unavailable: torch does not import")
        return rows.rows
    _device_rows(rows)
    rows.registry("presets", "memfit.models.presets", _presets)
    rows.registry("optimizers", "memfit.techniques.optimizers", _optimizers)
    return rows.rows


def _device_rows(rows: _Rows) -> None:
    import torch

    cuda = torch.cuda.is_available()
    rows.add("cuda", f"yes ({torch.cuda.device_count()} device(s): "
                     f"{torch.cuda.get_device_name(0)})" if cuda else "no")
    if cuda:
        rows.add("cuda bf16", "yes" if torch.cuda.is_bf16_supported() else "no")
    rows.probe("cpu bf16 autocast", _cpu_bf16_autocast, [])
    for device in ["cpu", "cuda"] if cuda else ["cpu"]:
        rows.probe(f"bitsandbytes 4-bit {device}", partial(_bnb_4bit, device),
                   ["bitsandbytes"])
        rows.probe(f"bitsandbytes 8-bit optim {device}", partial(_bnb_8bit_optimizer, device),
                   ["bitsandbytes"])
    rows.add("distributed gloo", "yes" if torch.distributed.is_gloo_available() else "no")


def describe() -> list[tuple[str, str]]:
    """What ``memfit env`` prints, computed in a child process (``describe_here``); never
    raises for a broken library, even one that kills the interpreter that imports it."""
    skipped: dict[str, str] = {}
    while True:
        reports, started, status = run_child(["memfit.environment", json.dumps(skipped)])
        rows = [(payload["name"], payload["value"]) for payload in reports]
        if status == 0 or started is None or started in skipped:
            if status != 0:
                rows.append(("memfit env", f"stopped early: {died(status)}"))
            return rows
        skipped[started] = died(status)


def calibrate() -> list[tuple[str, str]]:
    """``memfit env --calibrate``: this machine's device measured for the planner (the
    first GPU, else the CPU at this process's thread count) and cached; its rows."""
    import torch

    from memfit.plan.calibrate import calibrate_and_cache
    from memfit.plan.step_time import rate

    device = "cuda" if torch.cuda.is_available() else "cpu"
    profile, path, took = calibrate_and_cache(device)
    rows = [(f"matmul {dtype}", f"{rate(table, table[-1][0]) / 1e9:,.1f} GFLOP/s at a "
                                f"smallest side of {table[-1][0]:g}, "
                                f"{rate(table, table[0][0]) / 1e9:.3g} at {table[0][0]:g}")
            for dtype, table in profile.matmul.items()]
    return [("calibrated", f"{profile.name} in {took:.1f} s ({profile.note})"), *rows,
            ("memory bandwidth", f"{profile.memory[-1][1] / 1e9:,.1f} GB/s at "
                                 f"{profile.memory[-1][0] / 2**20:,.0f} MiB per op"),
            *((f"memory ({dtype})", f"{table[-1][1] / 1e9:,.1f} GB/s (element-wise ops in "
               f"{dtype})") for dtype, table in profile.memory_by_dtype.items()),
            ("per value beyond bytes", ", ".join(
                f"{op} {seconds * 1e9:.2g} ns" for op, seconds in profile.element_seconds.items())),
            ("host link", f"{profile.host_link / 1e9:,.1f} GB/s"),
            ("cost per op", f"{profile.op_seconds * 1e6:.1f} us (host time of each op of a "
                            "training step)"),
            ("calibration cache", str(path))]


if __name__ == "__main__":
    describe_here(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}, reporting=True)
