"""What ``memfit env`` reports: versions, devices, and which optional backends actually
work on this machine (each is tried for real on a tiny tensor, not guessed).

Every installed package is imported for real: an unpinned ``pip install timm`` or
``torchvision`` can replace the torch build or bring a torchvision compiled against another
torch, whose import then fails (``RuntimeError: operator torchvision::nms does not
exist``). Its row says so in one line, with the reinstall that pins this torch."""

from __future__ import annotations

import importlib
import importlib.metadata
import platform
from collections.abc import Callable

import torch

# Beside memfit's own dependencies, the libraries a model.factory commonly imports.
PACKAGES = ["memfit", "torch", "transformers", "peft", "bitsandbytes", "datasets",
            "safetensors", "tensorboard", "torchvision", "timm"]


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:120]}" if lines else type(error).__name__


def import_failure(module: str) -> str | None:
    """None when ``import module`` works; else the first line of what it raised."""
    try:
        importlib.import_module(module)
    except Exception as error:  # noqa: BLE001 -- whatever the import raised is the answer
        return _first_line(error)
    return None


def package_status(package: str) -> str:
    """The version of an installed, importable package; ``not installed``; or one line
    saying that it fails to import beside this torch and how to reinstall it."""
    version = _version(package)
    if version == "not installed":
        return version
    failure = import_failure(package)
    if failure is None:
        return version
    # The public version (no +cpu/+cu126): pip keeps the installed build when it matches.
    pinned = torch.__version__.split("+", 1)[0]
    return (f"{version} (broken with torch {torch.__version__}: {failure}; reinstall with "
            f"pip install {package} torch=={pinned})")


def _works(probe: Callable[[], object]) -> str:
    try:
        probe()
    except Exception as error:  # noqa: BLE001 -- any failure of the probe is its answer
        return f"no ({_first_line(error)})"
    return "yes"


def _bnb_4bit(device: str) -> None:
    import bitsandbytes.functional as bnbf

    weights = torch.randn(64, 64, device=device)
    packed, state = bnbf.quantize_4bit(weights, quant_type="nf4")
    bnbf.dequantize_4bit(packed, state)


def _bnb_8bit_optimizer(device: str) -> None:
    import bitsandbytes as bnb

    parameter = torch.nn.Parameter(torch.randn(64, 64, device=device))
    parameter.grad = torch.randn_like(parameter)
    bnb.optim.AdamW8bit([parameter]).step()


def _cpu_bf16_autocast() -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.randn(8, 8) @ torch.randn(8, 8)


def describe() -> list[tuple[str, str]]:
    from memfit.models.presets import preset_names
    from memfit.techniques.optimizers import SPECS

    rows = [("python", platform.python_version()), ("platform", platform.platform())]
    rows += [(package, package_status(package)) for package in PACKAGES]
    cuda = torch.cuda.is_available()
    rows.append(("cuda", f"yes ({torch.cuda.device_count()} device(s): "
                         f"{torch.cuda.get_device_name(0)})" if cuda else "no"))
    if cuda:
        rows.append(("cuda bf16", "yes" if torch.cuda.is_bf16_supported() else "no"))
    rows.append(("cpu bf16 autocast", _works(_cpu_bf16_autocast)))
    rows.append(("bitsandbytes 4-bit cpu", _works(lambda: _bnb_4bit("cpu"))))
    rows.append(("bitsandbytes 8-bit optim cpu", _works(lambda: _bnb_8bit_optimizer("cpu"))))
    if cuda:
        rows.append(("bitsandbytes 4-bit cuda", _works(lambda: _bnb_4bit("cuda"))))
        rows.append(("bitsandbytes 8-bit optim cuda",
                     _works(lambda: _bnb_8bit_optimizer("cuda"))))
    rows.append(("distributed gloo", "yes" if torch.distributed.is_gloo_available() else "no"))
    rows.append(("presets", ", ".join(preset_names())))
    rows.append(("optimizers", ", ".join(SPECS) + ", or a class path package.module:Class"))
    return rows
