"""Lion (memfit.optim.Lion) against the paper's update written out plainly, resumed from a
state_dict as if never stopped, with its own betas from the config, planned to the byte
(test_optimizer_specs covers every registered optimizer) and training the real loop."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from cli_helpers import tiny_run_arguments
from optimizer_oracle import (
    assert_resume_equals_uninterrupted,
    assert_steps_give,
    gradients,
    parameters,
)

import memfit
from memfit.config.ignored import IgnoredKeyWarning
from memfit.optim.lion import Lion
from memfit.techniques.config_checks import from_mapping, load_config
from memfit.techniques.optimizers import OptimizerSetting, build_optimizer

SHAPES = [(6, 4), (4,), (3, 5)]
LR, BETAS, DECAY = 1e-2, (0.8, 0.95), 0.1


def _reference(steps: int) -> list[torch.Tensor]:
    """Chen et al. 2023, Algorithm 2, one tensor at a time, no torch.optim."""
    weights = [p.detach().clone() for p in parameters(SHAPES)]
    moments = [torch.zeros_like(w) for w in weights]
    beta1, beta2 = BETAS
    for step in range(steps):
        for index, grad in enumerate(gradients(SHAPES, step)):
            if grad is None:
                continue
            update = torch.sign(beta1 * moments[index] + (1 - beta1) * grad)
            weights[index] = weights[index] - LR * (update + DECAY * weights[index])
            moments[index] = beta2 * moments[index] + (1 - beta2) * grad
    return weights


def _lion(params) -> Lion:  # noqa: ANN001
    return Lion([{"params": params, "weight_decay": DECAY}], lr=LR, betas=BETAS)


def test_lion_is_the_papers_update() -> None:
    assert_steps_give(SHAPES, _lion, 4, _reference(4), rtol=1e-6, atol=1e-7)


def test_save_load_continue_equals_uninterrupted() -> None:
    assert_resume_equals_uninterrupted(SHAPES, _lion)


def _setting(**optimizer):  # noqa: ANN003, ANN202
    return OptimizerSetting.of(from_mapping({"model": {"preset": "tiny-llama"},
                                             "data": {"path": "unused"},
                                             "optimizer": {"name": "lion", **optimizer}}))


def test_lion_runs_with_its_own_betas_unless_the_config_names_some() -> None:
    model = torch.nn.Linear(4, 4)
    assert build_optimizer(model, _setting()).param_groups[0]["betas"] == (0.9, 0.99)
    chosen = build_optimizer(model, _setting(betas=[0.95, 0.98]))
    assert chosen.param_groups[0]["betas"] == (0.95, 0.98)


def test_an_option_lion_does_not_read_is_named_as_ignored() -> None:
    with pytest.warns(IgnoredKeyWarning, match=r"optimizer.eps=1e-06 is ignored: optimizer.name="
                      r"lion does not read it \(it reads optimizer.lr, weight_decay, layerwise, "
                      r"betas\)"):
        _setting(eps=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", IgnoredKeyWarning)
        _setting(betas=[0.9, 0.98])


@pytest.mark.parametrize("layerwise", ["false", "true"])
def test_lion_lowers_the_loss(tmp_path: Path, instructions: Path, layerwise: str) -> None:
    path, *rest = tiny_run_arguments(
        instructions, tmp_path / "run", "data.eval_fraction=0", "log.tensorboard=false",
        "optimizer.name=lion", "optimizer.lr=1e-3", "train.lr_schedule=constant",
        "train.max_steps=6", f"optimizer.layerwise={layerwise}")
    result = memfit.train(load_config(path, rest))
    assert result.losses[6] < result.losses[1]
