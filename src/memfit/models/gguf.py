"""A GGUF file as ``model.path``: a ``.gguf`` file, or a folder holding exactly one and no
safetensors/.bin weights (a Hub GGUF repository downloaded as it is).

transformers reads GGUF itself (``from_pretrained(folder, gguf_file=name)``): the config
from the file's metadata, the tokenizer from its vocabulary, and the weights dequantized
into the dtype asked for, using the ``gguf`` package. memfit asks it for a plain dense
model (``GgufConfig(dequantize=True)`` where transformers has one, so no layer stays in
GGUF blocks that PEFT cannot wrap), then drops transformers' GGUF quantizer from the model,
which otherwise refuses ``save_pretrained``: what loaded is an ordinary model, and merge
and export write an ordinary Hugging Face folder.

A GGUF is a 4-byte magic ``GGUF``, a version (2 or 3), the tensor and metadata counts, the
metadata (key, type, value), the tensor table (name, shape, type, offset) and then the
tensor data; it is whole when every tensor's bytes lie inside the file.
"""

from __future__ import annotations

import contextlib
import importlib.util
import struct
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memfit._utils.errors import MemfitWarning, ModelError, first_line
from memfit.models.torch_forwards import torch_forwards

SUFFIX = ".gguf"
WEIGHT_PATTERNS = ("*.safetensors", "*.bin")  # a folder with these is a Hugging Face folder
_HEADER_BYTES = 24  # magic, version (uint32), tensor count, metadata count (uint64 each)
_VERSIONS = (2, 3)


def gguf_file(path: Path) -> Path | None:
    """The GGUF file ``model.path`` names, or None when it names something else (a Hugging
    Face folder, or nothing: folder_checks says what is wrong with it). A folder with
    several GGUF files and no weights is refused: which one is meant?"""
    if path.suffix.lower() == SUFFIX and not path.is_dir():
        return path
    if not path.is_dir() or any(any(path.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        return None
    found = sorted(file for file in path.iterdir()
                   if file.suffix.lower() == SUFFIX and file.is_file())
    if len(found) > 1:
        names = ", ".join(file.name for file in found[:3]) + (", ..." if len(found) > 3 else "")
        raise ModelError(f"model.path={path} holds {len(found)} GGUF files ({names}) and no "
                         f"safetensors weights; set model.path to one of them, e.g. "
                         f"model.path={found[0]}")
    return found[0] if found else None


@dataclass(frozen=True)
class GgufSummary:
    """What memfit needs to know of a GGUF file before transformers reads it."""

    problem: str | None  # why it cannot be loaded; None when it is whole
    tensor_types: tuple[str, ...] = ()  # storage types of its tensors: F32, F16, Q8_0, Q4_K
    has_vocabulary: bool = False  # tokenizer.ggml.tokens: transformers builds a tokenizer


def check_gguf(file: Path) -> GgufSummary:
    """``file`` is a whole GGUF file that transformers can load (one file, not a split)."""
    if not file.is_file():
        raise ModelError(f"model.path={file}: no such file (a .gguf file, or a Hugging Face "
                         "model folder with config.json, is needed)")
    for package in ("gguf", "accelerate"):  # transformers refuses GGUF without either
        if importlib.util.find_spec(package) is None:
            raise ModelError(f"model.path={file} is a GGUF file, and transformers loads those "
                             f"only with the {package} package: pip install {package}")
    status = file.stat()
    summary = _summary(str(file), status.st_mtime_ns, status.st_size)
    if summary.problem:
        raise ModelError(f"{file} is truncated or not a GGUF file: {summary.problem}")
    return summary


@lru_cache(maxsize=8)
def _summary(file: str, modified_ns: int, size: int) -> GgufSummary:
    """Cached per version of the file: a run checks it several times, and the gguf
    package's reader walks every token of the vocabulary (150k in a Qwen)."""
    with open(file, "rb") as handle:
        start = handle.read(8)
    if start[:4] != b"GGUF":
        return GgufSummary("it does not start with the magic bytes GGUF")
    if size < _HEADER_BYTES:
        return GgufSummary(f"{size} bytes, fewer than the {_HEADER_BYTES}-byte GGUF header")
    (version,) = struct.unpack("<I", start[4:8])
    if version not in _VERSIONS:
        return GgufSummary(f"GGUF version {version}; transformers reads versions 2 and 3")
    from gguf import GGUFReader

    try:
        reader = GGUFReader(file)
    except Exception as error:  # noqa: BLE001 -- it reports a damaged file with numpy's errors
        return GgufSummary(f"{size} bytes, cut short or damaged (or newer than the gguf "
                           f"package): its metadata and tensor table do not read "
                           f"({first_line(error, 120)})")
    return GgufSummary(_problem(reader, size),
                       tuple(sorted({tensor.tensor_type.name for tensor in reader.tensors})),
                       "tokenizer.ggml.tokens" in reader.fields)


def _problem(reader: Any, size: int) -> str | None:
    if not reader.tensors:
        return "it holds no tensors"
    end = max(int(tensor.data_offset) + int(tensor.n_bytes) for tensor in reader.tensors)
    if size < end:
        return f"{size} bytes, its tensor table describes {end}"
    split = _field(reader, "split.count")
    if isinstance(split, int) and split > 1:
        return (f"it is one of {split} parts of a split GGUF, which transformers cannot load; "
                "join the parts into one file first (llama.cpp's gguf-split --merge)")
    if not isinstance(_field(reader, "general.architecture"), str):
        return "its metadata has no general.architecture"
    return None


def _field(reader: Any, key: str) -> Any:
    """A scalar metadata value (int, float or str), None when absent."""
    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    value = field.parts[field.data[0]]
    if field.types and int(field.types[0]) == 8:  # GGUFValueType.STRING
        return bytes(value).decode("utf-8", errors="replace")
    return value.tolist()[0] if hasattr(value, "tolist") else value


def _gguf_arguments(file: Path) -> dict[str, Any]:
    """``from_pretrained`` arguments that load ``file``: the folder, and the file named
    absolutely (a relative ``gguf_file`` is looked up in the current directory first, where
    another file of that name may lie)."""
    return {"pretrained_model_name_or_path": file.parent, "gguf_file": str(file.absolute())}


def gguf_config(file: Path) -> Any:
    """The transformers config the file's metadata describes; no tensor data is read."""
    from transformers import AutoConfig

    check_gguf(file)
    try:
        return AutoConfig.from_pretrained(**_gguf_arguments(file))
    except (OSError, ValueError, KeyError, NotImplementedError) as error:
        raise ModelError(f"model.path={file}: transformers cannot read this GGUF file's "
                         f"config ({first_line(error)})") from None


def load_gguf_model(file: Path, auto_class: Any, dtype: torch.dtype,
                    config_overrides: dict[str, Any]) -> nn.Module:
    """The file's model, dequantized into ``dtype``, as a plain transformers model; its
    config changed by ``config_overrides`` (model.rope_scaling's) first."""
    summary = check_gguf(file)
    warnings.warn(f"model.path={file} is a GGUF file: transformers loads its "
                  f"{', '.join(summary.tensor_types)} tensors dequantized into model.dtype="
                  f"{str(dtype).removeprefix('torch.')}", MemfitWarning, stacklevel=3)
    try:
        with _quiet_dequantizing():
            model = auto_class.from_pretrained(**_gguf_arguments(file), dtype=dtype,
                                               **_dequantized(), **config_overrides,
                                               **torch_forwards())
    except (OSError, ValueError, KeyError, NotImplementedError, RuntimeError) as error:
        # RuntimeError: weights whose shapes differ from those the metadata describes
        raise ModelError(f"model.path={file}: transformers cannot load this GGUF file "
                         f"({first_line(error)})") from None
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # its weights are plain tensors now; the quantizer would
        quantizer.remove_quantization_config(model)  # refuse save_pretrained and casts
    return model


def gguf_tokenizer(file: Path) -> Any | None:
    """The tokenizer the file's vocabulary describes; None when it has none."""
    from transformers import AutoTokenizer

    if not check_gguf(file).has_vocabulary:
        return None
    try:
        return AutoTokenizer.from_pretrained(**_gguf_arguments(file))
    except Exception as error:  # noqa: BLE001 -- tokenizers has its own error types
        raise ModelError(f"model.path={file}: the tokenizer in this GGUF file cannot be "
                         f"loaded: {first_line(error)}") from None


def _dequantized() -> dict[str, Any]:
    """Ask for dense weights: newer transformers keep a GGUF's blocks packed when it can
    (layers PEFT cannot wrap or train through); older ones always dequantized."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


@contextlib.contextmanager
def _quiet_dequantizing() -> Iterator[None]:
    """transformers' GGUF reader shows a tqdm bar of its own, which its
    ``disable_progress_bar`` (the CLI's setting for loading bars) does not reach."""
    from transformers.utils import logging as transformers_logging

    try:
        from transformers import modeling_gguf_pytorch_utils as reader_module
    except ImportError:
        reader_module = None
    bar = getattr(reader_module, "tqdm", None)
    if bar is None or transformers_logging.is_progress_bar_enabled():
        yield
        return
    reader_module.tqdm = lambda iterable, *args, **kwargs: iterable
    try:
        yield
    finally:
        reader_module.tqdm = bar
