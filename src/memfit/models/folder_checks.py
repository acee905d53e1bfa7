"""A Hugging Face model folder, checked before ``transformers`` reads it: config.json is
a JSON object and every weight file is whole. ``transformers`` and ``safetensors`` report
these as tracebacks or as errors that do not say which file is at fault.

A .safetensors file is an 8-byte little-endian header length, a JSON header giving each
tensor's byte range, then the data; it is whole when the file is exactly as long as the
header says. A .bin file from ``torch.save`` is a zip archive, whose directory is at its end.
"""

from __future__ import annotations

import json
import re
import struct
import zipfile
from pathlib import Path

from memfit._utils.errors import ModelError

# Larger headers are not safetensors (its own reader refuses them too).
MAX_HEADER_BYTES = 100 * 1024 * 1024
# A Hugging Face Hub repository id: OWNER/NAME (letters, digits, '-', '_', '.').
_HUB_ID = re.compile(r"[\w\-][\w.\-]*/[\w\-][\w.\-]*")


def check_folder_exists(folder: Path) -> None:
    """``model.path`` is a folder here. A missing one that ends like a Hub id (OWNER/NAME,
    which a relative model.path became beside the config) gets how to make the folder:
    memfit never downloads."""
    if folder.is_dir():
        return
    if folder.exists():
        raise ModelError(f"model.path={folder} is a file; a Hugging Face model folder (with "
                         "config.json) or a .gguf file is needed")
    hub_id = "/".join(folder.parts[-2:])
    if _HUB_ID.fullmatch(hub_id):
        raise ModelError(f"model.path={folder}: no such folder; models are local folders "
                         f"(memfit downloads nothing): for the Hub's {hub_id}, make one with "
                         f"`huggingface-cli download {hub_id} --local-dir DIR` (or "
                         f"huggingface_hub.snapshot_download({hub_id!r}, local_dir=DIR)) and "
                         "set model.path=DIR")
    raise ModelError(f"model.path={folder}: no such folder (a Hugging Face model folder with "
                     "config.json is needed)")


def check_config_json(folder: Path) -> None:
    """The folder exists, and its config.json exists and holds a JSON object."""
    check_folder_exists(folder)
    path = folder / "config.json"
    if not path.is_file():
        raise ModelError(f"model.path={folder} is not a Hugging Face model folder "
                         "(no config.json)")
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise ModelError(f"{path} is not UTF-8 text (byte offset {error.start})") from None
    except json.JSONDecodeError as error:
        raise ModelError(f"{path} is not valid JSON: {error.msg} at line {error.lineno}, "
                         f"column {error.colno}") from None
    if not isinstance(loaded, dict):
        raise ModelError(f"{path} must hold a JSON object of settings, not a "
                         f"{type(loaded).__name__}")


def check_weight_files(folder: Path) -> None:
    """Every .safetensors and .bin file in ``folder`` is whole."""
    for file in sorted(folder.glob("*.safetensors")):
        problem = _safetensors_problem(file)
        if problem:
            raise ModelError(f"{file} is truncated or not a safetensors file: {problem}")
    for file in sorted(folder.glob("*.bin")):
        if not zipfile.is_zipfile(file):
            raise ModelError(f"{file} is truncated or not a PyTorch checkpoint: "
                             f"{file.stat().st_size} bytes without a zip directory at the end")


def _safetensors_problem(file: Path) -> str | None:
    size = file.stat().st_size
    with file.open("rb") as handle:
        start = handle.read(8)
        if len(start) < 8:
            return f"{size} bytes, fewer than the 8-byte header length"
        (header_bytes,) = struct.unpack("<Q", start)
        if header_bytes > min(MAX_HEADER_BYTES, size - 8):
            return f"its header claims {header_bytes} bytes, but the file has {size}"
        try:
            header = json.loads(handle.read(header_bytes))
            ends = [entry["data_offsets"][1] for name, entry in header.items()
                    if name != "__metadata__"]
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return "its header is not a safetensors JSON header"
    expected = 8 + header_bytes + max(ends, default=0)
    if size != expected:
        return f"{size} bytes, its header describes {expected}"
    return None
