"""The "images" format: image files and arrays -> ``images`` (and ``targets``) tensors.

``data.path`` is one file or a folder (searched recursively; hidden entries and memfit run
folders skipped) of PNG/JPEG/BMP/TIFF images (decoded with Pillow) and ``.npy``/``.npz``
arrays.

An image file is exactly one image, whatever its size or mode: Pillow converts it to the
configured channels (``L`` for 1, ``RGB`` for 3, as Pillow defines them: ITU-R 601-2 luma
for gray; alpha and palette transparency are dropped, not composited), except that a
single-channel image deeper than 8 bits (``I;16``, ``I``, ``F``) keeps its values and is
repeated into 3 channels when 3 are asked for.

Only array files hold stacks. An array is one image, (H, W), or (H, W, C) with C in 1, 3, 4
smaller than both sides; or a stack, (N, H, W), (N, H, W, C) or (N, C, H, W) with C in 1,
3, 4. A shape that two of these layouts fit ((5, 2, 3): one 5x2 image or five 2x3 images;
(8, 3, 3, 3)) is refused with the shape named. Every array of an ``.npz`` file is read.

Each image goes, in this order: to float intensities in [0, 1] (``normalize``), to the
configured channels (arrays: RGB -> gray by the same luma weights, alpha dropped), to
``size`` x ``size`` (``resize``), then through the ``contrast`` transforms -> the model
input ``images``; through ``target_contrast`` (from the same [0, 1] image) -> ``targets``,
present only when ``target_contrast`` is set. Everything is computed once, at build time:
noise is seeded per image, so every epoch and the evaluation see the same pictures.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from enum import Enum
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from memfit._utils.errors import ConfigError, DataError
from memfit._utils.folders import RUN_MARKER

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
ARRAY_EXTENSIONS = (".npy", ".npz")
_SUPPORTED = ", ".join(IMAGE_EXTENSIONS + ARRAY_EXTENSIONS)
_CHANNEL_COUNTS = (1, 3, 4)
# ITU-R BT.601 luma weights for R, G, B.
_LUMA = torch.tensor([0.299, 0.587, 0.114])


class ImageSettings(Protocol):
    """The fields of ``memfit.config.schema.ImagesConfig`` this module reads."""

    @property
    def size(self) -> int | None: ...
    @property
    def resize(self) -> str | Enum: ...
    @property
    def channels(self) -> int: ...
    @property
    def normalize(self) -> str | Enum: ...
    @property
    def contrast(self) -> tuple[str, ...]: ...
    @property
    def target_contrast(self) -> tuple[str, ...] | None: ...


def read_images(path: str, settings: ImageSettings, seed: int, key: str = "data.path"
                ) -> dict[str, torch.Tensor]:
    """``{"images": (N, C, S, S)}`` plus ``"targets"`` of the same shape when
    ``settings.target_contrast`` is set; float32 in [0, 1]. ``key``: the config key that
    names ``path``, for messages."""
    check_settings(settings)
    pictures = load_images(files_images(image_files(path, key), settings.channels), settings)
    return transformed(pictures, settings, seed)


def check_settings(settings: ImageSettings, targets: bool = True) -> None:
    """ConfigError for channels, size or a contrast entry the reader cannot apply
    (``targets``: target_contrast too)."""
    if settings.channels not in (1, 3):
        raise ConfigError(f"data.images.channels={settings.channels} must be 1 (grayscale) "
                          "or 3 (RGB)")
    if settings.size is not None and settings.size < 1:
        raise ConfigError(f"data.images.size={settings.size} must be at least 1, or null")
    parse_contrast(settings.contrast, "data.images.contrast")
    if targets and settings.target_contrast is not None:
        parse_contrast(settings.target_contrast, "data.images.target_contrast")


def transformed(base: torch.Tensor, settings: ImageSettings, seed: int, targets: bool = True
                ) -> dict[str, torch.Tensor]:
    """Images as ``load_images`` gives them -> ``{"images": ...}`` through the contrast
    transforms, plus ``"targets"`` (``target_contrast``) when set and ``targets``."""
    make_input = parse_contrast(settings.contrast, "data.images.contrast")
    make_target = (None if settings.target_contrast is None or not targets
                   else parse_contrast(settings.target_contrast, "data.images.target_contrast"))
    inputs = torch.stack([make_input(image, _generator(seed, i, 0))
                          for i, image in enumerate(base)])
    if make_target is None:
        return {"images": inputs}
    outputs = torch.stack([make_target(image, _generator(seed, i, 1))
                           for i, image in enumerate(base)])
    return {"images": inputs, "targets": outputs}


def image_files(path: str, key: str = "data.path") -> list[str]:
    """``path`` itself, or the supported files below the folder ``path``, sorted."""
    if not os.path.exists(path):
        raise DataError(f"{key} {path} does not exist; give an image file or a folder of "
                        f"images ({_SUPPORTED})")
    if os.path.isdir(path):
        files = []
        for folder, subfolders, names in os.walk(path):
            # A memfit run folder's plots are no training images (a run is refused inside
            # its data folder; one made there before, or copied in, is skipped).
            subfolders[:] = [name for name in subfolders if not name.startswith(".")
                             and not os.path.isfile(os.path.join(folder, name, RUN_MARKER))]
            files += [os.path.join(folder, name) for name in names if not name.startswith(".")
                      and _extension(name) in IMAGE_EXTENSIONS + ARRAY_EXTENSIONS]
        files.sort()
        if not files:
            raise DataError(f"{key} {path} is a folder with no images; supported: {_SUPPORTED}")
        return files
    if _extension(path) not in IMAGE_EXTENSIONS + ARRAY_EXTENSIONS:
        raise DataError(f"{key} {path} is not an image or array file; supported: {_SUPPORTED}"
                        " (data.format=images)")
    return [path]


# --- contrast transforms: (C, H, W) in [0, 1] -> (C, H, W) in [0, 1] ----------------------

Transform = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


def _gamma(gamma: float) -> Transform:
    return lambda x, _: x**gamma


def _invert() -> Transform:
    return lambda x, _: 1.0 - x


def _window(level: float, width: float) -> Transform:
    # Radiology window: [level - width/2, level + width/2] maps to [0, 1], the rest clips.
    return lambda x, _: ((x - (level - width / 2)) / width).clamp(0, 1)


def _stretch(low_percentile: float = 1.0, high_percentile: float = 99.0) -> Transform:
    def stretch(x: torch.Tensor, _: torch.Generator) -> torch.Tensor:
        bounds = torch.quantile(x.flatten(), torch.tensor([low_percentile, high_percentile]) / 100)
        low, high = bounds.tolist()
        return ((x - low) / max(high - low, 1e-12)).clamp(0, 1)
    return stretch


def _noise(sigma: float) -> Transform:
    return lambda x, generator: (x + sigma * torch.randn(x.shape, generator=generator)).clamp(0, 1)


# name -> (builder, number of arguments it accepts (min, max), rule on the arguments)
_TRANSFORMS: dict[str, tuple[Callable[..., Transform], tuple[int, int],
                             Callable[[list[float]], str | None]]] = {
    "gamma": (_gamma, (1, 1), lambda a: None if a[0] > 0 else "G must be positive"),
    "invert": (_invert, (0, 0), lambda a: None),
    "window": (_window, (2, 2), lambda a: None if a[1] > 0 else "WIDTH must be positive"),
    "stretch": (_stretch, (0, 2), lambda a: None if len(a) < 2 or 0 <= a[0] < a[1] <= 100
                else "need 0 <= LOW < HIGH <= 100"),
    "noise": (_noise, (1, 1), lambda a: None if a[0] >= 0 else "SIGMA must be 0 or more"),
}
_SYNTAX = "gamma:G, invert, window:LEVEL:WIDTH, stretch[:LOW:HIGH], noise:SIGMA"


def parse_contrast(specs: Sequence[str], key: str) -> Transform:
    """``["gamma:0.5", "noise:0.02"]`` -> one transform applying them in order; a bad
    entry is a ConfigError naming ``key``, the entry and the valid forms."""
    steps = [_parse_one(spec, key) for spec in specs]

    def apply(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        for step in steps:
            x = step(x, generator)
        return x
    return apply


def _parse_one(spec: str, key: str) -> Transform:
    name, *text = str(spec).strip().split(":")
    if name not in _TRANSFORMS:
        raise ConfigError(f"{key}: unknown contrast transform {spec!r}; valid: {_SYNTAX}")
    build, (fewest, most), rule = _TRANSFORMS[name]
    try:
        arguments = [float(part) for part in text]
    except ValueError:
        raise ConfigError(f"{key}: {spec!r} has a non-numeric argument; valid: {_SYNTAX}") from None
    problem = (f"takes {fewest}-{most} arguments" if not fewest <= len(arguments) <= most
               else rule(arguments))
    if problem or not all(math.isfinite(a) for a in arguments):
        raise ConfigError(f"{key}: {spec!r}: {problem or 'arguments must be finite'}; "
                          f"valid: {_SYNTAX}")
    return build(*arguments)


def _generator(seed: int, index: int, role: int) -> torch.Generator:
    # One stream per (run seed, image, input/target): the same image always gets the same
    # noise, and input and target get independent noise.
    return torch.Generator().manual_seed((seed * 1_000_003 + index) * 2 + role)


# --- decoding, normalisation, channels, size ----------------------------------------------

def files_images(files: list[str], channels: int) -> Iterator[tuple[str, np.ndarray]]:
    """``file_images`` of each file, in order."""
    for file in files:
        yield from file_images(file, channels)


def load_images(arrays: Iterable[tuple[str, np.ndarray]], settings: ImageSettings
                ) -> torch.Tensor:
    """(where, (H, W, C) array) pairs (``file_images``, ``stack_images``) -> (N, C, S, S)
    float32 in [0, 1]: normalized, to the configured channels, resized."""
    images: list[torch.Tensor] = []
    first_where = ""
    for where, array in arrays:
        image = _to_unit_range(array, _choice(settings.normalize))  # (H, W, C) float
        image = _to_channels(torch.from_numpy(image).permute(2, 0, 1), settings.channels)
        image = _resize(image, settings.size, _choice(settings.resize))
        if images and image.shape != images[0].shape:
            raise DataError(
                f"image {where} is {tuple(image.shape[1:])} but {first_where} is "
                f"{tuple(images[0].shape[1:])}; set data.images.size to resize all to one")
        first_where = first_where or where
        images.append(image)
    return torch.stack(images).float()


def file_images(file: str, channels: int) -> list[tuple[str, np.ndarray]]:
    """(description, (H, W, C) array) for each image in ``file``: exactly one for an image
    file (decoded to ``channels``), one or more for an array file."""
    try:
        if _extension(file) == ".npy":
            named = {"": np.load(file, allow_pickle=False)}
        elif _extension(file) == ".npz":
            with np.load(file, allow_pickle=False) as archive:
                named = {name: archive[name] for name in archive.files}
        else:
            return [(file, _decode(file, channels))]
    except Exception as error:  # an unreadable file is the user's to fix
        raise DataError(f"cannot read image file {file}: {error}".splitlines()[0]) from error
    found = []
    for name, array in named.items():
        where = f"{file}[{name}]" if name else file
        images = _array_images(array, where)
        found += [(f"{where} #{i}" if len(images) > 1 else where, image)
                  for i, image in enumerate(images)]
    if not found:
        raise DataError(f"image file {file} holds no images")
    return found


def stack_images(array: np.ndarray, where: str) -> list[tuple[str, np.ndarray]]:
    """A stack of images, (N, H, W), (N, H, W, C) or (N, C, H, W) -> (description,
    (H, W, C)) each."""
    _check_numbers(array, where)
    if array.ndim not in (3, 4):
        raise DataError(f"image array {where} has shape {array.shape}; need a stack {_STACKS}")
    return [(f"{where} #{i}", image) for i, image in enumerate(_stack(array, where))]


# Pillow modes of one channel deeper than 8 bits: their values are kept, not cut to 8 bits.
_DEEP_MODES = ("I", "F", "I;16", "I;16L", "I;16B", "I;16N")


def _decode(file: str, channels: int) -> np.ndarray:
    """An image file -> one (H, W, channels) array (uint8; deep gray: uint16, int32 or
    float32 with one channel, repeated by ``_to_channels``)."""
    from PIL import Image

    with Image.open(file) as image:
        if image.mode in _DEEP_MODES:
            array = np.asarray(image)
            if image.mode == "I" and array.size and array.min() >= 0 and array.max() <= 65535:
                array = array.astype(np.uint16)  # 16-bit PNGs decode to int32 of 0..65535
            return array.astype(array.dtype.newbyteorder("="))[:, :, None]
        if image.mode in ("P", "PA"):  # a palette's transparency goes the way of alpha
            image = image.convert("RGBA")
        array = np.asarray(image.convert("L" if channels == 1 else "RGB"))
        return array[:, :, None] if array.ndim == 2 else array


_STACKS = "(N, H, W), (N, H, W, C) or (N, C, H, W) with C in 1, 3, 4"


def _check_numbers(array: np.ndarray, where: str) -> None:
    if array.dtype.kind not in "biuf":
        raise DataError(f"image array {where} has dtype {array.dtype}; need numbers")


def _array_images(array: np.ndarray, where: str) -> list[np.ndarray]:
    """An array -> its images, each (H, W, C); a shape two layouts fit is refused."""
    _check_numbers(array, where)
    if array.ndim == 2:
        return [array[:, :, None]]
    if array.ndim == 3:
        one_image = array.shape[-1] in _CHANNEL_COUNTS and array.shape[-1] < min(array.shape[:2])
        if one_image:
            return [array]
        if array.shape[-1] in _CHANNEL_COUNTS:  # (H, W, C) with a side <= C, or (N, H, W)
            raise DataError(
                f"image array {where} has shape {array.shape}: one {array.shape[0]}x"
                f"{array.shape[1]} image with {array.shape[2]} channels, or "
                f"{array.shape[0]} images of {array.shape[1]}x{array.shape[2]}? Save one image "
                "as (1, H, W, C), or a stack as (N, H, W, 1)")
        return _stack(array, where)
    if array.ndim == 4:
        return _stack(array, where)
    raise DataError(f"image array {where} has shape {array.shape}; need one image (H, W) or "
                    f"(H, W, C), or a stack {_STACKS}")


def _stack(array: np.ndarray, where: str) -> list[np.ndarray]:
    """(N, H, W), (N, H, W, C) or (N, C, H, W) -> N arrays (H, W, C)."""
    if array.ndim == 3:
        return [image[:, :, None] for image in array]
    channels_last, channels_first = (array.shape[3] in _CHANNEL_COUNTS,
                                     array.shape[1] in _CHANNEL_COUNTS)
    if channels_last and channels_first:
        raise DataError(
            f"image array {where} has shape {array.shape}: (N, H, W, C) or (N, C, H, W)? "
            "Both fit; resize the images or save them with more than 4 pixels a side")
    if channels_last:
        return list(array)
    if channels_first:
        return list(array.transpose(0, 2, 3, 1))
    raise DataError(f"image array {where} has shape {array.shape}; need a stack {_STACKS}")


def _to_unit_range(array: np.ndarray, normalize: str) -> np.ndarray:
    """(H, W, C) of any number type -> float32 in [0, 1]."""
    if array.dtype.kind == "b":
        return array.astype(np.float32)
    if normalize == "auto" and array.dtype.kind == "u":
        return (array / np.iinfo(array.dtype).max).astype(np.float32)
    values = array.astype(np.float32)
    if normalize == "auto" and array.dtype.kind == "f" and values.min() >= 0 and values.max() <= 1:
        return values  # already in [0, 1]: used as it is
    low, high = float(values.min()), float(values.max())
    return (values - low) / (high - low) if high > low else np.zeros_like(values)


def _to_channels(image: torch.Tensor, channels: int) -> torch.Tensor:
    """(C, H, W) with C in 1, 2 (gray + alpha), 3, 4 -> (channels, H, W)."""
    if image.shape[0] in (2, 4):
        image = image[:-1]  # drop alpha
    if image.shape[0] == channels:
        return image
    if channels == 3:
        return image.expand(3, -1, -1).clone()
    return (image * _LUMA[:, None, None]).sum(0, keepdim=True)


def _resize(image: torch.Tensor, size: int | None, mode: str) -> torch.Tensor:
    """(C, H, W) -> (C, size, size); ``crop`` keeps the aspect ratio and cuts the centre."""
    if size is None:
        return image
    height, width = image.shape[1:]
    if mode == "crop":
        scale = size / min(height, width)
        target = (max(size, round(height * scale)), max(size, round(width * scale)))
    else:
        target = (size, size)
    if target != (height, width):
        # Bilinear with antialiasing: a positive filter, so [0, 1] stays in [0, 1].
        image = F.interpolate(image[None], size=target, mode="bilinear", antialias=True,
                              align_corners=False)[0]
    top, left = (image.shape[1] - size) // 2, (image.shape[2] - size) // 2
    return image[:, top:top + size, left:left + size]


def _choice(value: str | Enum) -> str:
    return str(value.value if isinstance(value, Enum) else value)


def _extension(name: str) -> str:
    return os.path.splitext(name)[1].lower()
