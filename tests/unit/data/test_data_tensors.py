"""Format "tensors": .npz and .pt files of named arrays, split and stacked."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from memfit._utils.errors import DataError
from memfit.data import build_datasets, collate

IMAGES = torch.arange(10 * 2 * 4 * 4, dtype=torch.float32).reshape(10, 2, 4, 4)
TARGETS = torch.arange(10)


def write(kind: str, folder) -> str:
    if kind == "npz":
        np.savez(folder / "d.npz", images=IMAGES.numpy(), targets=TARGETS.numpy())
        return str(folder / "d.npz")
    if kind == "pt":
        torch.save({"images": IMAGES, "targets": TARGETS}, folder / "d.pt")
        return str(folder / "d.pt")
    assert kind == "folder"
    (folder / "parts").mkdir()
    torch.save({"images": IMAGES[:6], "targets": TARGETS[:6]}, folder / "parts" / "a.pt")
    torch.save({"images": IMAGES[6:], "targets": TARGETS[6:]}, folder / "parts" / "b.pt")
    return str(folder / "parts")


@pytest.mark.parametrize("kind", ["npz", "pt", "folder"])
def test_example_i_is_row_i_of_every_array(kind, tmp_path, cfg):
    splits = build_datasets(cfg(write(kind, tmp_path), "tensors", eval_fraction=0.2), None, seed=3)
    assert (len(splits.train), len(splits.eval)) == (8, 2)
    seen = sorted(
        int(example["targets"]) for split in splits.__dict__.values() for example in split
    )
    assert seen == list(range(10))
    example = splits.eval[1]
    assert torch.equal(example["images"], IMAGES[int(example["targets"])])
    batch = collate([splits.train[0], splits.train[1]])
    assert batch["images"].shape == (2, 2, 4, 4) and batch["targets"].shape == (2,)


def test_arrays_of_different_lengths_are_rejected(tmp_path, cfg):
    torch.save({"images": IMAGES, "targets": TARGETS[:9]}, tmp_path / "d.pt")
    with pytest.raises(DataError, match=r"d.pt: every array needs the same first dimension"):
        build_datasets(cfg(tmp_path / "d.pt", "tensors"), None)


def test_a_pt_file_must_hold_a_dict_of_tensors(tmp_path, cfg):
    torch.save([IMAGES], tmp_path / "d.pt")
    with pytest.raises(DataError, match=r"d.pt must hold a non-empty dict of named tensors"):
        build_datasets(cfg(tmp_path / "d.pt", "tensors"), None)


def test_files_whose_shapes_cannot_batch_together_are_rejected_naming_both(tmp_path, cfg):
    (tmp_path / "parts").mkdir()
    torch.save({"images": IMAGES[:6], "targets": TARGETS[:6]}, tmp_path / "parts" / "a.pt")
    torch.save({"images": IMAGES[6:, :1], "targets": TARGETS[6:]}, tmp_path / "parts" / "b.pt")
    with pytest.raises(DataError, match=r"b.pt: images has shape \(4, 1, 4, 4\) but data file "
                                        r".*a.pt has \(6, 2, 4, 4\)"):
        build_datasets(cfg(tmp_path / "parts", "tensors"), None)


def test_eval_path_is_the_whole_eval_split_with_the_training_shapes(tmp_path, cfg):
    torch.save({"images": IMAGES, "targets": TARGETS}, tmp_path / "train.pt")
    torch.save({"images": IMAGES[:3], "targets": TARGETS[:3]}, tmp_path / "eval.pt")
    data = cfg(tmp_path / "train.pt", "tensors", eval_path=str(tmp_path / "eval.pt"))
    splits = build_datasets(data, None)
    assert (len(splits.train), len(splits.eval)) == (10, 3)
    torch.save({"images": IMAGES[:3, :, :2], "targets": TARGETS[:3]}, tmp_path / "eval.pt")
    with pytest.raises(DataError, match=r"data.eval_path .*eval.pt: images has shape "
                                        r"\(3, 2, 2, 4\) but data.path .*train.pt has"):
        build_datasets(data, None)


def test_token_arrays_need_a_mask_per_token(tmp_path, cfg):
    ids = torch.ones(4, 6, dtype=torch.long)
    torch.save({"input_ids": ids, "attention_mask": ids[:, :5], "labels": torch.arange(4)},
               tmp_path / "d.pt")
    with pytest.raises(DataError, match=r"attention_mask has shape \(4, 5\) but input_ids "
                                        r"\(4, 6\)"):
        build_datasets(cfg(tmp_path / "d.pt", "tensors"), None)
    torch.save({"input_ids": ids, "attention_mask": ids, "labels": torch.arange(4)},
               tmp_path / "d.pt")
    splits = build_datasets(cfg(tmp_path / "d.pt", "tensors"), None)
    batch = collate([splits.train[0], splits.train[1]])
    assert batch["labels"].tolist() == [0, 1] and batch["input_ids"].shape == (2, 6)
