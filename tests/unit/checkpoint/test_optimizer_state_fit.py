"""An intact checkpoint whose optimizer state is not this optimizer's (the layer-wise
layout an earlier memfit wrote: one state_dict per parameter) stops the resume with one
line naming the file, instead of a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from memfit._utils.errors import CheckpointError
from memfit.checkpoint import load_checkpoint, save_checkpoint
from memfit.checkpoint.manifest import CheckpointKind, write_manifest
from memfit.checkpoint.state import TrainerState
from memfit.optim import LayerwiseOptimizer


def _layerwise_training():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 1))
    optimizer = LayerwiseOptimizer(
        model.parameters(), make_optimizer=lambda groups: torch.optim.AdamW(groups, lr=1e-2))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    model(torch.randn(5, 4)).sum().backward()  # the hooks step each parameter
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


def test_the_same_optimizer_resumes_its_layer_wise_state(tmp_path: Path):
    model, optimizer, scheduler = _layerwise_training()
    folder = save_checkpoint(tmp_path, TrainerState(step=1), model, optimizer, scheduler,
                             None, keep=2)
    again, again_optimizer, again_scheduler = _layerwise_training()
    load_checkpoint(folder, again, again_optimizer, again_scheduler, None)
    for mine, saved in zip(again_optimizer.inner_optimizers, optimizer.inner_optimizers,
                           strict=True):
        for key in ("exp_avg", "exp_avg_sq"):
            first = next(iter(saved.state.values()))[key]
            torch.testing.assert_close(next(iter(mine.state.values()))[key], first)


def test_an_earlier_layer_wise_layout_is_refused_in_one_line(tmp_path: Path):
    model, optimizer, scheduler = _layerwise_training()
    folder = save_checkpoint(tmp_path, TrainerState(step=1), model, optimizer, scheduler,
                             None, keep=2)
    earlier = {"param_groups": optimizer.state_dict()["param_groups"],
               "optimizers": [inner.state_dict() for inner in optimizer.inner_optimizers]}
    torch.save(earlier, folder / "optimizer.pt")
    (folder / "manifest.json").unlink()
    write_manifest(folder, CheckpointKind.SINGLE_PROCESS, 1)  # intact, as it was written
    with pytest.raises(CheckpointError, match=r"optimizer\.pt: its state does not fit this "
                                              r"run's optimizer \(this layer-wise"):
        load_checkpoint(folder, *_layerwise_training(), None)
