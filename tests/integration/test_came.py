"""CAME (memfit.optim.CAME, optimizer.name=came) against the paper's update written out
plainly, resumed from a state_dict as if never stopped, with its own key optimizer.beta3
range-checked at load, refused under FSDP2 with the key to change, planned to the byte
(test_optimizer_specs covers every registered optimizer) and training the real loop."""

from __future__ import annotations

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
from memfit._utils.errors import ConfigError
from memfit.optim.came import CAME
from memfit.techniques.config_checks import from_mapping, load_config
from memfit.techniques.optimizers import OptimizerSetting, build_optimizer

SHAPES = [(6, 4), (4,), (2, 3, 5)]
LR, BETAS, BETA3, DECAY, EPS = 1e-2, (0.8, 0.95), 0.9, 0.1, (1e-30, 1e-16)


def _clipped(update: torch.Tensor) -> torch.Tensor:
    return update / max(1.0, float(update.pow(2).mean().sqrt()))  # d = 1


def _matrix_step(weight, grad, state):  # noqa: ANN001, ANN202
    """Luo et al. 2023, Algorithm 1, for one n x m matrix, with the paper's sums:
    V = r c^T / (1^T r)."""
    beta1, beta2 = BETAS
    squares = grad * grad + EPS[0]
    state["r"] = beta2 * state["r"] + (1 - beta2) * squares.sum(dim=1)
    state["c"] = beta2 * state["c"] + (1 - beta2) * squares.sum(dim=0)
    update = _clipped(grad / torch.sqrt(torch.outer(state["r"], state["c"]) / state["r"].sum()))
    state["m"] = beta1 * state["m"] + (1 - beta1) * update
    instability = (update - state["m"]) ** 2 + EPS[1]
    state["R"] = BETA3 * state["R"] + (1 - BETA3) * instability.sum(dim=1)
    state["C"] = BETA3 * state["C"] + (1 - BETA3) * instability.sum(dim=0)
    confidence = torch.sqrt(torch.outer(state["R"], state["C"]) / state["R"].sum())
    return weight * (1 - LR * DECAY) - LR * state["m"] / confidence


def _vector_step(weight, grad, state):  # noqa: ANN001, ANN202
    """A vector: a plain second moment, and the first moment as the step."""
    beta1, beta2 = BETAS
    state["v"] = beta2 * state["v"] + (1 - beta2) * (grad * grad + EPS[0])
    state["m"] = beta1 * state["m"] + (1 - beta1) * _clipped(grad / torch.sqrt(state["v"]))
    return weight * (1 - LR * DECAY) - LR * state["m"]


def _reference(steps: int) -> list[torch.Tensor]:
    """One tensor at a time, no torch.optim; a 3-D tensor clips over all of it and keeps
    factored statistics per matrix of its last two dims."""
    weights = [p.detach().clone() for p in parameters(SHAPES)]
    states = []
    for weight in weights:
        matrices = weight.reshape(-1, *weight.shape[-2:]) if weight.dim() >= 2 else None
        states.append([{"m": torch.zeros(n, m), "r": torch.zeros(n), "c": torch.zeros(m),
                        "R": torch.zeros(n), "C": torch.zeros(m)}
                       for n, m in [matrix.shape for matrix in matrices]]
                      if matrices is not None else
                      {"m": torch.zeros_like(weight), "v": torch.zeros_like(weight)})
    for step in range(steps):
        for index, grad in enumerate(gradients(SHAPES, step)):
            if grad is None:
                continue
            weight, state = weights[index], states[index]
            if weight.dim() == 1:
                weights[index] = _vector_step(weight, grad, state)
            elif weight.dim() == 2:
                weights[index] = _matrix_step(weight, grad, state[0])
            else:
                weights[index] = _stacked_step(weight, grad, state)
    return weights


def _stacked_step(weight, grad, states):  # noqa: ANN001, ANN202
    """A (k, n, m) tensor: each matrix's statistics, the RMS clip over the whole tensor."""
    beta1, beta2 = BETAS
    updates = []
    for matrix, state in zip(grad, states, strict=True):
        squares = matrix * matrix + EPS[0]
        state["r"] = beta2 * state["r"] + (1 - beta2) * squares.sum(dim=1)
        state["c"] = beta2 * state["c"] + (1 - beta2) * squares.sum(dim=0)
        updates.append(matrix / torch.sqrt(torch.outer(state["r"], state["c"])
                                           / state["r"].sum()))
    update = _clipped(torch.stack(updates))
    new = []
    for matrix, weight_matrix, state in zip(update, weight, states, strict=True):
        state["m"] = beta1 * state["m"] + (1 - beta1) * matrix
        instability = (matrix - state["m"]) ** 2 + EPS[1]
        state["R"] = BETA3 * state["R"] + (1 - BETA3) * instability.sum(dim=1)
        state["C"] = BETA3 * state["C"] + (1 - BETA3) * instability.sum(dim=0)
        confidence = torch.sqrt(torch.outer(state["R"], state["C"]) / state["R"].sum())
        new.append(weight_matrix * (1 - LR * DECAY) - LR * state["m"] / confidence)
    return torch.stack(new)


def _came(params) -> CAME:  # noqa: ANN001
    return CAME([{"params": params, "weight_decay": DECAY}], lr=LR, betas=BETAS, beta3=BETA3,
                eps=EPS)


def test_came_is_the_papers_update() -> None:
    assert_steps_give(SHAPES, _came, 4, _reference(4), rtol=1e-5, atol=1e-6)


def test_save_load_continue_equals_uninterrupted() -> None:
    assert_resume_equals_uninterrupted(SHAPES, _came)


def _config(**optimizer):  # noqa: ANN003, ANN202
    return from_mapping({"model": {"preset": "tiny-llama"}, "data": {"path": "unused"},
                         "optimizer": {"name": "came", **optimizer}})


def test_its_betas_and_beta3_come_from_the_config() -> None:
    model = torch.nn.Linear(4, 4)
    group = build_optimizer(model, OptimizerSetting.of(_config())).param_groups[0]
    assert (group["betas"], group["beta3"]) == ((0.9, 0.999), 0.9999)
    chosen = build_optimizer(model, OptimizerSetting.of(_config(betas=[0.8, 0.9], beta3=0.99)))
    assert (chosen.param_groups[0]["betas"], chosen.param_groups[0]["beta3"]) == (
        (0.8, 0.9), 0.99)


def test_beta3_out_of_range_is_one_line_at_load() -> None:
    with pytest.raises(ConfigError, match=r"optimizer.beta3=1.5 is outside 0.0 to 0.999999 "
                                          r"\(a key of optimizer.name=came\)"):
        _config(beta3=1.5)


def test_fsdp_is_refused_naming_the_strategy_to_use() -> None:
    with pytest.raises(ConfigError, match="distributed.strategy=fsdp cannot be combined with "
                                          "optimizer.name=came: its statistics read whole rows "
                                          "and columns.*use distributed.strategy=ddp"):
        from_mapping({"model": {"preset": "tiny-llama"}, "data": {"path": "unused"},
                      "optimizer": {"name": "came"},
                      "distributed": {"strategy": "fsdp", "nproc": 2}})


def test_came_lowers_the_loss_with_layerwise_updates(tmp_path: Path, instructions: Path) -> None:
    path, *rest = tiny_run_arguments(
        instructions, tmp_path / "run", "data.eval_fraction=0", "log.tensorboard=false",
        "optimizer.name=came", "optimizer.lr=1e-3", "train.lr_schedule=constant",
        "train.max_steps=6", "optimizer.layerwise=true")
    result = memfit.train(load_config(path, rest))
    assert result.losses[6] < result.losses[1]
