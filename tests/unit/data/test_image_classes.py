"""model.task=image-classification's data: class folders and .npz files of images and
labels -> class names (model.labels, model.num_labels) and (images, labels) splits; the
errors a user sees. Expected values are written out by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from memfit._utils.errors import DataError
from memfit._utils.folders import RUN_MARKER
from memfit.config.schema import DataConfig, ImagesConfig
from memfit.data import build_datasets, classes, collate
from memfit.data.images import read_images


def write_png(path: Path, value: int, size: int = 8) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size, size), value, dtype=np.uint8)).save(path)


def class_folders(root: Path, counts: dict[str, int]) -> Path:
    """root/<class>/<i>.png; the value of each pixel is 10 * (class index + 1) + i."""
    for index, (name, count) in enumerate(counts.items()):
        for i in range(count):
            write_png(root / name / f"{i}.png", 10 * (index + 1) + i)
    return root


def data(path: Path, eval_path: Path | None = None, **values) -> DataConfig:
    images = ImagesConfig(**values.pop("images", {}))
    return DataConfig(path=str(path), eval_path=None if eval_path is None else str(eval_path),
                      format="images", eval_fraction=values.pop("eval_fraction", 0.0),
                      images=images, **values)


def test_folder_names_are_the_classes_sorted_and_each_image_gets_its_folders_id(tmp_path):
    train = class_folders(tmp_path / "train", {"dog": 2, "cat": 3, "bird": 1})
    (train / ".hidden").mkdir()
    write_png(train / ".hidden" / "x.png", 0)  # hidden: skipped
    write_png(train / "cat" / ".thumb.png", 0)
    (train / "runs").mkdir()
    (train / "runs" / RUN_MARKER).write_text("")  # a memfit run folder: not a class
    write_png(train / "runs" / "memory.png", 0)
    (train / "README.md").write_text("not read")  # a file beside the class folders
    config = data(train)
    names = classes(config)
    assert names == ("bird", "cat", "dog")
    splits = build_datasets(config, None, labels=names)
    batch = collate([splits.train[i] for i in range(len(splits.train))])
    assert batch["images"].shape == (6, 1, 8, 8) and len(splits.eval) == 0
    # Files sorted within each class (classes in name order): bird/0, cat/0..2, dog/0..1.
    assert batch["labels"].tolist() == [0, 1, 1, 1, 2, 2]
    expected = torch.tensor([30, 20, 21, 22, 10, 11]) / 255
    torch.testing.assert_close(batch["images"][:, 0, 0, 0], expected)


def test_model_labels_fix_the_order_and_num_labels_widens(tmp_path):
    train = class_folders(tmp_path / "train", {"cat": 1, "dog": 1})
    assert classes(data(train), labels=("dog", "cat", "fox")) == ("dog", "cat", "fox")
    labels = build_datasets(data(train), None, labels=("dog", "cat", "fox")).train
    assert [int(labels[i]["labels"]) for i in range(2)] == [1, 0]
    assert classes(data(train), num_labels=4) == ("cat", "dog", "LABEL_2", "LABEL_3")
    with pytest.raises(DataError, match="label 'dog', which is not one of model.labels"):
        classes(data(train), labels=("cat", "fox"))
    with pytest.raises(DataError, match="model.num_labels=1 is fewer than the 2 classes"):
        classes(data(train), num_labels=1)


def test_images_go_through_the_same_preprocessing_as_the_images_format(tmp_path):
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        path = tmp_path / "train" / name / "0.png"
        path.parent.mkdir(parents=True)
        Image.fromarray(rng.integers(0, 255, (12, 20, 3), dtype=np.uint8)).save(path)
    settings = {"size": 8, "channels": 1, "contrast": ("gamma:0.5", "noise:0.1")}
    config = data(tmp_path / "train", images=settings)
    split = build_datasets(config, None, seed=3, labels=("a", "b")).train
    ours = torch.stack([split[i]["images"] for i in range(2)])
    plain = read_images(str(tmp_path / "train"), ImagesConfig(**settings), seed=3)["images"]
    torch.testing.assert_close(ours, plain)


def test_npz_labels_may_be_class_ids_or_names(tmp_path):
    images = np.stack([np.full((6, 6), value, dtype=np.uint8) for value in (0, 50, 100, 150)])
    np.savez(tmp_path / "ids.npz", images=images, labels=np.array([2, 0, 1, 0]))
    np.savez(tmp_path / "names.npz", images=images,
             labels=np.array(["zebra", "ant", "zebra", "bee"]))
    assert classes(data(tmp_path / "ids.npz")) == ("0", "1", "2")
    ids = build_datasets(data(tmp_path / "ids.npz"), None, labels=("0", "1", "2")).train
    assert [int(ids[i]["labels"]) for i in range(4)] == [2, 0, 1, 0]
    names = classes(data(tmp_path / "names.npz"))
    assert names == ("ant", "bee", "zebra")
    split = build_datasets(data(tmp_path / "names.npz"), None, labels=names).train
    assert [int(split[i]["labels"]) for i in range(4)] == [2, 0, 2, 1]
    assert split[1]["images"].shape == (1, 6, 6)


def test_eval_fraction_splits_the_images_and_eval_path_has_the_same_layout(tmp_path):
    train = class_folders(tmp_path / "train", {"a": 5, "b": 5})
    splits = build_datasets(data(train, eval_fraction=0.2), None, labels=("a", "b"))
    assert (len(splits.train), len(splits.eval)) == (8, 2)
    held = class_folders(tmp_path / "eval", {"b": 2})  # a class may be absent from eval
    splits = build_datasets(data(train, held), None, labels=("a", "b"))
    assert len(splits.train) == 10
    assert [int(splits.eval[i]["labels"]) for i in range(2)] == [1, 1]


@pytest.mark.parametrize("case, fragments", [
    ("no class folders", ["data.path", "has no class subfolders", "(it holds images: 0.png",
                          "<path>/<class>/<image>"]),
    ("loose image", ["stray.png lies outside the class folders (a, b)"]),
    ("empty class", ["class folder 'b' holds no images; supported: .png"]),
    ("unknown extension", ["a/notes.txt is not an image file; class folders hold images "
                           "only: .png, .jpg"]),
    ("eval class train lacks", ["data.eval_path", "class folder 'c' is not one of the classes "
                                "the model trains on (a, b"]),
    ("one class", ["the training data has one class ('a' in all 2 images)"]),
    ("npz without labels", ["holds arrays ['images']", "needs 'images' (N, H, W), (N, H, W, C) "
                            "or (N, C, H, W) and "
                            "'labels' (N,)"]),
    ("npz float labels", ["'labels' has dtype float64; labels are integers (class ids) or "
                          "strings (class names)"]),
    ("npz label count", ["'labels' has shape (3,), but 'images' holds 2 images"]),
    ("npz id beyond names", ["data.eval_path", "eval.npz: label 5 of image #1 is not a class "
                             "id of this model (0..1: 0, 1)"]),
    ("a single image", ["is a file, not a folder of class folders"]),
    ("missing", ["does not exist; model.task=image-classification reads"]),
])
def test_bad_layouts_are_one_line_errors_naming_the_path_and_the_choices(tmp_path, case,
                                                                      fragments):
    train, held = tmp_path / "train", None
    if case == "no class folders":
        write_png(train / "0.png", 0)
    elif case == "loose image":
        class_folders(train, {"a": 1, "b": 1})
        write_png(train / "stray.png", 0)
    elif case == "empty class":
        class_folders(train, {"a": 1})
        (train / "b").mkdir()
    elif case == "unknown extension":
        class_folders(train, {"a": 1, "b": 1})
        (train / "a" / "notes.txt").write_text("x")
    elif case == "eval class train lacks":
        class_folders(train, {"a": 1, "b": 1})
        held = class_folders(tmp_path / "eval", {"a": 1, "c": 1})
    elif case == "one class":
        class_folders(train, {"a": 2})
    elif case.startswith("npz"):
        pictures = np.zeros((2, 4, 4), dtype=np.uint8)
        train = tmp_path / "train.npz"
        arrays = {"npz without labels": {},
                  "npz float labels": {"labels": np.array([0.0, 1.0])},
                  "npz label count": {"labels": np.array([0, 1, 1])},
                  "npz id beyond names": {"labels": np.array([0, 1])}}[case]
        np.savez(train, images=pictures, **arrays)
        if case == "npz id beyond names":
            held = tmp_path / "eval.npz"
            np.savez(held, images=pictures, labels=np.array([1, 5]))
    elif case == "a single image":
        write_png(tmp_path / "one.png", 0)
        train = tmp_path / "one.png"
    with pytest.raises(DataError) as caught:
        classes(data(train, held))
    message = str(caught.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
