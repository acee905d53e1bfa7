"""data.format=images: decoding, normalisation, channels, size, contrast transforms, split
and the errors a user sees. Expected values are written out by hand or in plain numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from memfit._utils.errors import ConfigError, DataError
from memfit.config.schema import DataConfig, ImagesConfig
from memfit.data import build_datasets, collate
from memfit.data.images import parse_contrast, read_images
from memfit.data.phantoms import random_phantoms


def settings(**values) -> ImagesConfig:
    return ImagesConfig(**values)


def test_png_files_of_each_mode_become_unit_range_tensors(tmp_path):
    gray = np.arange(64, dtype=np.uint8).reshape(8, 8) * 4
    Image.fromarray(gray).save(tmp_path / "a_gray.png")
    rgb = np.zeros((8, 8, 3), dtype=np.uint8)
    rgb[..., 0] = 255  # pure red
    Image.fromarray(rgb).save(tmp_path / "b_rgb.png")
    deep = (np.arange(64, dtype=np.uint16).reshape(8, 8) * 1000)
    Image.fromarray(deep).save(tmp_path / "c_16bit.png")
    images = read_images(str(tmp_path), settings(), seed=0)["images"]
    assert images.shape == (3, 1, 8, 8) and images.dtype == torch.float32
    torch.testing.assert_close(images[0, 0], torch.from_numpy(gray / 255).float())
    # Pillow's L of pure red: 255 * 299 / 1000 rounded, ITU-R 601-2 luma in 8 bits.
    torch.testing.assert_close(images[1], torch.full((1, 8, 8), 76 / 255))
    torch.testing.assert_close(images[2, 0], torch.from_numpy(deep / 65535).float())
    as_rgb = read_images(str(tmp_path / "a_gray.png"), settings(channels=3), seed=0)["images"]
    assert as_rgb.shape == (1, 3, 8, 8) and torch.equal(as_rgb[0, 0], as_rgb[0, 2])


def test_arrays_in_unit_range_are_used_as_they_are_and_others_rescaled(tmp_path):
    phantoms = random_phantoms(5, 16, seed=1)  # (5, 16, 16) float32 in [0, 1]
    np.save(tmp_path / "stack.npy", phantoms)
    loaded = read_images(str(tmp_path / "stack.npy"), settings(), seed=0)["images"]
    assert torch.equal(loaded[:, 0], torch.from_numpy(phantoms))
    scaled = np.arange(16, dtype=np.float32).reshape(4, 4) * 10 - 30  # -30 .. 120
    np.savez(tmp_path / "scaled.npz", first=scaled, second=scaled[:, :, None])
    both = read_images(str(tmp_path / "scaled.npz"), settings(), seed=0)["images"]
    expected = torch.from_numpy((scaled + 30) / 150)
    assert both.shape == (2, 1, 4, 4)
    torch.testing.assert_close(both[0, 0], expected)
    torch.testing.assert_close(both[1, 0], expected)
    stretched = read_images(str(tmp_path / "stack.npy"), settings(normalize="minmax"),
                            seed=0)["images"]
    assert stretched.amin(dim=(1, 2, 3)).eq(0).all() and stretched.amax(dim=(1, 2, 3)).eq(1).all()


def test_resize_crop_keeps_the_centre_and_stretch_fills_the_square(tmp_path):
    wide = np.zeros((8, 16), dtype=np.float32)
    wide[:, 4:12] = 1.0  # the centre 8 columns are bright
    np.save(tmp_path / "wide.npy", wide)
    cropped = read_images(str(tmp_path / "wide.npy"), settings(size=8), seed=0)["images"]
    assert torch.equal(cropped, torch.ones(1, 1, 8, 8))
    # Oracle: Pillow's antialiased bilinear resize of the same float image.
    pattern = np.random.default_rng(0).random((8, 16), dtype=np.float32)
    np.save(tmp_path / "wide.npy", pattern)
    stretched = read_images(str(tmp_path / "wide.npy"), settings(size=4, resize="stretch"),
                            seed=0)["images"]
    expected = np.asarray(Image.fromarray(pattern, mode="F").resize((4, 4), Image.BILINEAR))
    torch.testing.assert_close(stretched[0, 0], torch.from_numpy(expected.copy()))


def test_contrast_transforms_match_their_formulas():
    x = torch.linspace(0, 1, 11).view(1, 1, 11)
    generator = torch.Generator().manual_seed(0)

    def run(*specs):
        return parse_contrast(specs, "data.images.contrast")(x, generator)

    torch.testing.assert_close(run("gamma:2"), x**2)
    torch.testing.assert_close(run("invert"), 1 - x)
    torch.testing.assert_close(run("invert", "gamma:2"), (1 - x) ** 2)  # in order
    # window: level 0.5, width 0.4 -> [0.3, 0.7] maps to [0, 1]
    torch.testing.assert_close(run("window:0.5:0.4"), ((x - 0.3) / 0.4).clamp(0, 1))
    # stretch 10th..90th percentile: of 0, 0.1, .., 1 those are 0.1 and 0.9
    torch.testing.assert_close(run("stretch:10:90"), ((x - 0.1) / 0.8).clamp(0, 1))
    noisy = run("noise:0.1")
    assert not torch.equal(noisy, x) and noisy.min() >= 0 and noisy.max() <= 1


def test_noise_is_seeded_per_image_and_independent_between_input_and_target(tmp_path):
    np.save(tmp_path / "flat.npy", np.full((4, 8, 8), 0.5, dtype=np.float32))
    config = settings(contrast=("noise:0.1",), target_contrast=("noise:0.1",))
    first = read_images(str(tmp_path), config, seed=3)
    again = read_images(str(tmp_path), config, seed=3)
    assert torch.equal(first["images"], again["images"])
    assert not torch.equal(first["images"], first["targets"])
    assert not torch.equal(first["images"][0], first["images"][1])
    other_seed = read_images(str(tmp_path), config, seed=4)
    assert not torch.equal(first["images"], other_seed["images"])


def test_targets_only_with_target_contrast_and_split_into_batches(tmp_path):
    np.save(tmp_path / "phantoms.npy", random_phantoms(10, 16, seed=0))
    plain = read_images(str(tmp_path), settings(contrast=("invert",)), seed=0)
    assert set(plain) == {"images"}
    data = DataConfig(path=str(tmp_path), format="images", eval_fraction=0.2,
                      images=settings(contrast=("invert",), target_contrast=()))
    splits = build_datasets(data, tokenizer=None, seed=0)
    assert (len(splits.train), len(splits.eval)) == (8, 2)
    batch = collate([splits.train[0], splits.train[1]])
    assert batch["images"].shape == batch["targets"].shape == (2, 1, 16, 16)
    torch.testing.assert_close(batch["images"], 1 - batch["targets"])


@pytest.mark.parametrize("spec, message", [
    ("blur:2", "unknown contrast transform 'blur:2'"),
    ("gamma", "takes 1-1 arguments"),
    ("gamma:-1", "G must be positive"),
    ("window:0.5:0", "WIDTH must be positive"),
    ("stretch:90:10", "need 0 <= LOW < HIGH <= 100"),
    ("noise:x", "non-numeric argument"),
])
def test_bad_contrast_specs_name_the_key_and_the_valid_forms(spec, message):
    with pytest.raises(ConfigError, match=message) as error:
        parse_contrast([spec], "data.images.target_contrast")
    assert str(error.value).startswith("data.images.target_contrast: ")
    assert "valid: gamma:G, invert, window:LEVEL:WIDTH" in str(error.value)


def test_bad_inputs_are_one_line_data_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        read_images(str(tmp_path / "missing"), settings(), seed=0)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(DataError, match="folder with no images; supported: .png"):
        read_images(str(tmp_path), settings(), seed=0)
    with pytest.raises(DataError, match="not an image or array file"):
        read_images(str(tmp_path / "notes.txt"), settings(), seed=0)
    np.save(tmp_path / "a.npy", np.zeros((8, 8), dtype=np.float32))
    np.save(tmp_path / "b.npy", np.zeros((6, 6), dtype=np.float32))
    with pytest.raises(DataError, match=r"b.npy is \(6, 6\) but .*a.npy is \(8, 8\); set "
                                        "data.images.size"):
        read_images(str(tmp_path), settings(), seed=0)
    np.save(tmp_path / "b.npy", np.zeros((2, 2, 8, 8), dtype=np.float32))
    with pytest.raises(DataError, match=r"shape \(2, 2, 8, 8\); need a stack \(N, H, W\)"):
        read_images(str(tmp_path), settings(), seed=0)
    (tmp_path / "b.npy").write_bytes(b"not numpy")
    with pytest.raises(DataError, match="cannot read image file .*b.npy"):
        read_images(str(tmp_path), settings(), seed=0)
    with pytest.raises(ConfigError, match="data.images.channels=2 must be 1"):
        read_images(str(tmp_path), settings(channels=2), seed=0)
