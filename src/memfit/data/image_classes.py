"""Class-labelled images, for model.task=image-classification (data.format=images).

``data.path`` (and ``data.eval_path``, in the same layout) is either

- a folder of class folders, ``train/<class>/<image>``: each non-hidden subfolder (memfit
  run folders skipped) is a class, named by the folder, and every image below it
  (searched recursively, hidden entries skipped) is an example of it. Class folders hold
  images only (PNG/JPEG/BMP/TIFF); other files directly in ``data.path`` are not read, an
  image there (outside every class) is refused; or
- a ``.npz`` file with an ``images`` stack, (N, H, W), (N, H, W, C) or (N, C, H, W) (the
  layouts of data/images.py), and ``labels``, (N,), class ids (integers) or class names
  (strings).

Labels are listed before anything is decoded (``list_labelled``), so the classes are
known, and checked, before a model is built. Folder names are class names; the classes
come from the training split as for text classification (data/classification.py:
``FoundLabels``, ``class_names`` with model.labels and model.num_labels), and every label
of both splits must be one of them (``class_ids``). The pictures go through the reader of
data/images.py (normalize, channels, resize, contrast), as an autoencoder's do.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from memfit._utils.errors import DataError
from memfit._utils.folders import RUN_MARKER
from memfit.config.limits import MAX_CLASSES
from memfit.data.classification import FoundLabels
from memfit.data.images import (
    IMAGE_EXTENSIONS,
    ImageSettings,
    files_images,
    load_images,
    stack_images,
)

_LAYOUT = ("a folder of class folders (<path>/<class>/<image>, e.g. train/cat/1.png) or a .npz "
           "file with arrays 'images' and 'labels'")
_IMAGE_TYPES = ", ".join(IMAGE_EXTENSIONS)


@dataclass(frozen=True)
class Labelled:
    """The examples of one data.path / data.eval_path, listed, not decoded."""

    key: str  # the config key naming ``path``
    path: str
    labels: tuple[int, ...] | tuple[str, ...]  # one per example
    files: tuple[str, ...]  # class folders: the image file of each example; () for a .npz

    def where(self, index: int) -> str:
        return self.files[index] if self.files else f"image #{index}"


def list_labelled(path: str, key: str = "data.path") -> Labelled:
    """The examples under ``path`` (module docstring), each with its label; DataError for
    a layout that is neither, an empty class, a file that is no image, bad labels."""
    if not os.path.exists(path):
        raise DataError(f"{key} {path} does not exist; model.task=image-classification reads "
                        f"{_LAYOUT}")
    if os.path.isdir(path):
        return _class_folders(path, key)
    if os.path.splitext(path)[1].lower() == ".npz":
        return _npz_labels(path, key)
    raise DataError(f"{key} {path} is a file, not {_LAYOUT}")


def _visible(name: str) -> bool:
    return not name.startswith(".")


def _class_folders(path: str, key: str) -> Labelled:
    entries = sorted(os.listdir(path))
    classes = [name for name in entries if _visible(name)
               and os.path.isdir(os.path.join(path, name))
               and not os.path.isfile(os.path.join(path, name, RUN_MARKER))]
    loose = [name for name in entries if _visible(name) and name not in classes
             and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS]
    if not classes:
        found = f" (it holds images: {loose[0]}, ...)" if loose else ""
        raise DataError(f"{key} {path} has no class subfolders{found}; "
                        f"model.task=image-classification reads {_LAYOUT}")
    if loose:
        raise DataError(f"{key} {path}: {loose[0]} lies outside the class folders "
                        f"({', '.join(classes)}); put each image in its class's folder")
    files: list[str] = []
    labels: list[str] = []
    for name in classes:
        found = _images_of_class(os.path.join(path, name), key)
        if not found:
            raise DataError(f"{key} {path}: class folder '{name}' holds no images; supported: "
                            f"{_IMAGE_TYPES}")
        files += found
        labels += [name] * len(found)
    return Labelled(key, path, tuple(labels), tuple(files))


def _images_of_class(folder: str, key: str) -> list[str]:
    """The image files below a class folder, sorted; a file of another kind is refused."""
    files = []
    for where, subfolders, names in os.walk(folder):
        subfolders[:] = sorted(name for name in subfolders if _visible(name)
                               and not os.path.isfile(os.path.join(where, name, RUN_MARKER)))
        for name in sorted(filter(_visible, names)):
            file = os.path.join(where, name)
            if os.path.splitext(name)[1].lower() not in IMAGE_EXTENSIONS:
                raise DataError(f"{key}: {file} is not an image file; class folders hold "
                                f"images only: {_IMAGE_TYPES}")
            files.append(file)
    return sorted(files)


def _npz_labels(path: str, key: str) -> Labelled:
    try:
        with np.load(path, allow_pickle=False) as archive:
            names = list(archive.files)
            if "images" not in names or "labels" not in names:
                raise DataError(f"{key} {path} holds arrays {names}; model.task="
                                "image-classification needs 'images' (N, H, W), (N, H, W, C) "
                                "or (N, C, H, W) and 'labels' (N,)")
            labels, count = archive["labels"], archive["images"].shape[0]
    except DataError:
        raise
    except Exception as error:  # an unreadable file (object arrays need pickle) is the user's
        raise DataError(f"cannot read {key} {path}: {error}".splitlines()[0]) from error
    if labels.ndim != 1 or len(labels) != count:
        raise DataError(f"{key} {path}: 'labels' has shape {labels.shape}, but 'images' holds "
                        f"{count} images; give one label per image, shape ({count},)")
    if labels.dtype.kind in "iu":
        if len(labels) and labels.min() < 0:
            raise DataError(f"{key} {path}: label {labels.min()} is a negative class id; "
                            "integer labels are ids 0, 1, 2, ...")
        if len(labels) and labels.max() >= MAX_CLASSES:
            raise DataError(f"{key} {path}: label {labels.max()} is a class id beyond memfit's "
                            f"limit of {MAX_CLASSES:,} classes")
        values: tuple = tuple(int(value) for value in labels)
    elif labels.dtype.kind in "US":
        values = tuple(value.decode() if isinstance(value, bytes) else str(value)
                       for value in labels.tolist())
        if "" in values:
            raise DataError(f"{key} {path}: the label of image #{values.index('')} is an "
                            "empty string; a "
                            "class name must have at least one character")
    else:
        raise DataError(f"{key} {path}: 'labels' has dtype {labels.dtype}; labels are integers "
                        "(class ids) or strings (class names)")
    if not values:
        raise DataError(f"{key} {path} holds no images")
    return Labelled(key, path, values, ())


def found_labels(labelled: Labelled, indices: Sequence[int]) -> FoundLabels:
    """The distinct labels of the training examples ``indices``; DataError for fewer than
    two classes."""
    values = sorted({labelled.labels[index] for index in indices})  # type: ignore[type-var]
    if len(values) < 2:
        only = f"{values[0]!r} in all {len(indices)} images" if values else "no images"
        raise DataError(f"{labelled.key} {labelled.path}: the training data has one class "
                        f"({only}); a classifier needs at least 2 classes to learn")
    return FoundLabels(tuple(values), len(indices))


def class_ids(labelled: Labelled, indices: Sequence[int], names: Sequence[str]
              ) -> torch.Tensor:
    """(len(indices),) int64 class ids of those examples; DataError for a label that is
    not one of ``names`` (a class the model does not train on is refused, not scored)."""
    position = {name: index for index, name in enumerate(names)}
    ids = []
    for index in indices:
        value = labelled.labels[index]
        if isinstance(value, int):
            if value >= len(names):
                raise DataError(f"{labelled.key} {labelled.path}: label {value} of "
                                f"{labelled.where(index)} is not a class id of this model "
                                f"(0..{len(names) - 1}: {', '.join(names)})")
            ids.append(value)
        elif value not in position:
            what = (f"class folder '{value}'" if labelled.files
                    else f"label {value!r} of {labelled.where(index)}")
            raise DataError(f"{labelled.key} {labelled.path}: {what} is not one of the classes "
                            f"the model trains on ({', '.join(names)}: the training data's "
                            "classes, or model.labels)")
        else:
            ids.append(position[value])
    return torch.tensor(ids, dtype=torch.long)


def read(labelled: Labelled, settings: ImageSettings) -> torch.Tensor:
    """Every example's picture, (N, C, S, S) float32 in [0, 1], before contrast."""
    if labelled.files:  # image files: exactly one image each
        return load_images(files_images(list(labelled.files), settings.channels), settings)
    with np.load(labelled.path, allow_pickle=False) as archive:
        return load_images(stack_images(archive["images"], f"{labelled.path}[images]"),
                           settings)
