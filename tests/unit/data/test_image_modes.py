"""One image file is one image, whatever its mode or size; only array files hold stacks, in
the layouts the docs state, and a shape two layouts fit is refused by name.

The oracle for image files is Pillow itself: ``Image.convert("L" | "RGB")`` of the same
file, divided by 255 (the reader promises channels "as Pillow defines them")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from memfit._utils.errors import DataError
from memfit.config.schema import DataConfig, ImagesConfig
from memfit.data import build_datasets, classes, collate
from memfit.data.images import read_images


def picture(mode: str, height: int, width: int, seed: int = 0) -> Image.Image:
    """A random picture of ``mode`` (P: a random palette, with one transparent entry)."""
    rng = np.random.default_rng(seed)
    rgba = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
    if mode == "I;16":
        return Image.fromarray(rng.integers(0, 65536, (height, width), dtype=np.uint16))
    if mode == "P":
        image = Image.fromarray(rgba[..., :3]).quantize(colors=8)
        image.info["transparency"] = 0
        return image
    return Image.fromarray(rgba, mode="RGBA").convert(mode)


MODES = ["1", "L", "LA", "P", "RGB", "RGBA", "I;16", "CMYK"]
SHAPES = [(1, 1), (1, 3), (3, 1), (2, 40), (40, 2), (4, 4), (9, 7)]  # tiny and thin


def extension(mode: str) -> str:
    return ".tiff" if mode == "CMYK" else ".png"  # PNG has no CMYK


def expected(path: Path, channels: int) -> torch.Tensor:
    """(channels, H, W) as the docs promise: Pillow's conversion / 255; 16-bit gray kept
    as its values / 65535 (repeated into RGB)."""
    with Image.open(path) as image:
        if image.mode.startswith("I;16"):
            gray = torch.from_numpy(np.asarray(image).astype(np.float32) / 65535)[None]
            return gray.expand(channels, -1, -1)
        if image.mode == "P":
            image = image.convert("RGBA")
        array = np.asarray(image.convert("L" if channels == 1 else "RGB")).astype(np.float32)
    array = array[..., None] if array.ndim == 2 else array
    return torch.from_numpy(array / 255).permute(2, 0, 1)


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("mode", MODES)
def test_an_image_file_of_any_mode_and_size_is_exactly_one_image(tmp_path, mode, channels):
    for height, width in SHAPES:
        path = tmp_path / f"{mode.replace(';', '')}-{height}x{width}{extension(mode)}"
        picture(mode, height, width).save(path)
        with Image.open(path) as saved:
            assert saved.mode == mode  # the file really is of that mode
        images = read_images(str(path), ImagesConfig(channels=channels), seed=0)["images"]
        assert images.shape == (1, channels, height, width), (mode, height, width)
        torch.testing.assert_close(images[0], expected(path, channels))


def test_a_folder_of_mixed_modes_is_one_image_per_file_in_name_order(tmp_path):
    for index, mode in enumerate(MODES):
        picture(mode, 5, 3, seed=index).save(tmp_path / f"{index}{extension(mode)}")
    images = read_images(str(tmp_path), ImagesConfig(channels=3, size=4), seed=0)["images"]
    assert images.shape == (len(MODES), 3, 4, 4)
    alone = read_images(str(tmp_path / "7.tiff"), ImagesConfig(channels=3, size=4), seed=0)
    torch.testing.assert_close(images[7], alone["images"][0])  # the last file is the last image


def test_small_and_thin_pngs_are_class_examples_not_stacks(tmp_path):
    """A 3x40 RGB or 1x1 LA picture in a class folder is one example (it was refused as
    "holds 3 images")."""
    for name, (mode, height, width) in {"a/0.png": ("RGB", 3, 40), "a/1.png": ("LA", 1, 1),
                                        "b/0.png": ("RGBA", 2, 2), "b/1.png": ("L", 40, 3)}.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        picture(mode, height, width).save(tmp_path / name)
    config = DataConfig(path=str(tmp_path), format="images", eval_fraction=0.0,
                        images=ImagesConfig(size=6, resize="stretch"))
    splits = build_datasets(config, None, labels=classes(config))
    batch = collate([splits.train[i] for i in range(len(splits.train))])
    assert batch["images"].shape == (4, 1, 6, 6) and batch["labels"].tolist() == [0, 0, 1, 1]


@pytest.mark.parametrize("shape, count, one_shape", [
    ((6, 5), 1, (6, 5, 1)),  # (H, W)
    ((6, 5, 3), 1, (6, 5, 3)),  # (H, W, C), C smaller than both sides
    ((2, 6, 5), 2, (6, 5, 1)),  # (N, H, W)
    ((2, 6, 5, 4), 2, (6, 5, 4)),  # (N, H, W, C)
    ((2, 3, 6, 5), 2, (6, 5, 3)),  # (N, C, H, W)
])
def test_arrays_hold_the_stated_layouts(tmp_path, shape, count, one_shape):
    array = np.random.default_rng(0).random(shape, dtype=np.float32)
    np.save(tmp_path / "a.npy", array)
    images = read_images(str(tmp_path / "a.npy"), ImagesConfig(channels=3), seed=0)["images"]
    assert images.shape == (count, 3, *one_shape[:2])
    first = array if count == 1 else array[0]
    first = first.transpose(1, 2, 0) if shape == (2, 3, 6, 5) else first
    first = first[..., None] if first.ndim == 2 else first
    wanted = torch.from_numpy(np.ascontiguousarray(first[..., :3])).permute(2, 0, 1)
    torch.testing.assert_close(images[0], wanted.expand(3, -1, -1))


@pytest.mark.parametrize("shape, fragment", [
    ((5, 2, 3), "shape (5, 2, 3): one 5x2 image with 3 channels, or 5 images of 2x3?"),
    ((3, 3, 3), "shape (3, 3, 3): one 3x3 image with 3 channels, or 3 images of 3x3?"),
    ((2, 3, 5, 4), "shape (2, 3, 5, 4): (N, H, W, C) or (N, C, H, W)? Both fit"),
    ((2, 2, 8, 8), "shape (2, 2, 8, 8); need a stack (N, H, W), (N, H, W, C) or (N, C, H, W)"),
    ((2, 2, 2, 8, 8), "shape (2, 2, 2, 8, 8); need one image (H, W) or (H, W, C)"),
])
def test_an_ambiguous_or_unknown_array_shape_is_one_line_naming_it(tmp_path, shape, fragment):
    np.save(tmp_path / "a.npy", np.zeros(shape, dtype=np.float32))
    with pytest.raises(DataError) as caught:
        read_images(str(tmp_path / "a.npy"), ImagesConfig(), seed=0)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)
    assert str(tmp_path / "a.npy") in str(caught.value)
