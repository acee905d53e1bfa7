"""`memfit predict` on an image classifier: one line per image file, each naming its file,
whatever the file's mode or size (an LA PNG, a 1x1 icon, a 2-pixel-high strip, a palette
PNG, a CMYK TIFF, a 16-bit PNG); an array file's stack gives one line per image.

The oracle: each file converted by Pillow to the run's channels and saved as a plain
grayscale PNG (the 16-bit one cut to 8 bits) gets the same label and probability."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_in_process, write_config
from PIL import Image

pytestmark = pytest.mark.usefixtures("quiet_transformers")


def stripes(vertical: bool, rng: np.random.Generator) -> np.ndarray:
    y, x = np.mgrid[:8, :8]
    return (((x if vertical else y) // 2 % 2) * 200 + rng.integers(0, 40, (8, 8))).astype(
        np.uint8)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A conv-classifier run of two classes of 8x8 gray pictures (4 steps: predictions
    only need to be the model's, not good)."""
    folder = tmp_path_factory.mktemp("predict-images")
    rng = np.random.default_rng(0)
    for name in ("horizontal", "vertical"):
        (folder / "train" / name).mkdir(parents=True)
        for index in range(4):
            Image.fromarray(stripes(name == "vertical", rng)).save(
                folder / "train" / name / f"{index}.png")
    config = write_config(folder / "images.yaml", {
        "model": {"preset": "conv-classifier", "task": "image-classification"},
        "data": {"path": "train", "format": "images", "eval_fraction": 0,
                 "images": {"size": 8, "resize": "stretch"}},
        "adapter": {"kind": "lora", "targets": ["conv"]},
        "train": {"max_steps": 4, "micro_batch_size": 4, "output_dir": "runs/images"},
        "log": {"progress": False, "tensorboard": False}})
    result = run_in_process("train", str(config), cwd=folder)
    assert result.returncode == 0, result.stderr
    return folder


def new_pictures(folder: Path) -> list[str]:
    """Files of many modes and sizes; their names, sorted as predict reads them."""
    folder.mkdir()
    rng = np.random.default_rng(1)
    rgba = rng.integers(0, 256, (9, 9, 4), dtype=np.uint8)
    Image.fromarray(rgba, "RGBA").convert("LA").save(folder / "a-la.png")
    Image.fromarray(rgba[:1, :1], "RGBA").convert("RGB").save(folder / "b-icon-1x1.png")
    Image.fromarray(rgba[:2, :, :], "RGBA").save(folder / "c-strip-2x9.png")
    Image.fromarray(rgba[..., :3]).quantize(colors=6).save(folder / "d-palette.png")
    Image.fromarray(rgba, "RGBA").convert("CMYK").save(folder / "e-cmyk.tiff")
    Image.fromarray(rng.integers(0, 65536, (5, 3), dtype=np.uint16)).save(folder / "f-16.png")
    Image.fromarray(stripes(True, rng)).save(folder / "g-plain.png")
    return sorted(path.name for path in folder.iterdir())


def predict(run: Path, file: Path) -> list[dict]:
    result = run_in_process("predict", "runs/images", str(file), cwd=run)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_one_line_per_image_file_with_its_name_and_its_own_prediction(run, tmp_path):
    names = new_pictures(tmp_path / "new")
    records = predict(run, tmp_path / "new")
    assert [record["row"] for record in records] == list(range(len(names)))
    assert [Path(record["file"]).name for record in records] == names
    # The oracle: the same pictures as Pillow's plain grayscale PNGs, in the same order.
    (tmp_path / "plain").mkdir()
    for name in names:
        with Image.open(tmp_path / "new" / name) as image:
            if image.mode.startswith("I;16"):
                image = Image.fromarray((np.asarray(image) // 257).astype(np.uint8))
            elif image.mode == "P":
                image = image.convert("RGBA")
            image.convert("L").save(tmp_path / "plain" / f"{name}.png")
    plain = predict(run, tmp_path / "plain")
    assert [record["label"] for record in plain] == [record["label"] for record in records]
    for deep, alone in zip(records, plain, strict=True):
        rel = 1e-2 if deep["file"].endswith("f-16.png") else 1e-6  # 16 bits vs 8
        assert alone["probability"] == pytest.approx(deep["probability"], rel=rel)


def test_an_array_stack_gives_one_line_per_image(run, tmp_path):
    stack = np.stack([stripes(vertical, np.random.default_rng(2)) for vertical in (0, 1, 1)])
    np.save(tmp_path / "three.npy", stack)  # (3, 8, 8): a stack of three gray images
    records = predict(run, tmp_path / "three.npy")
    assert [record["file"] for record in records] == [
        f"{tmp_path / 'three.npy'} #{index}" for index in range(3)]
    assert records[1]["label"] == records[2]["label"]
    assert records[1]["probability"] == pytest.approx(records[2]["probability"])
