"""The verdict on a step with a nan/inf loss or gradient norm, and the weight check."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from memfit._utils.errors import TrainingDiverged
from memfit.techniques.config_checks import from_mapping
from memfit.training.nonfinite import (
    DivergenceGuard,
    Verdict,
    first_nonfinite_weight,
    nonfinite_quantity,
)


def _guard(optimizer: dict | None = None, scaler: bool = False, **train) -> DivergenceGuard:
    config = from_mapping({"model": {"factory": "factories:regressor", "task": "custom"},
                           "data": {"path": "data.npz", "format": "tensors"},
                           "optimizer": optimizer or {"lr": 10.0}, "train": train})
    return DivergenceGuard(config.train, config.optimizer, None, scaler_checks_gradients=scaler)


def test_the_loss_is_named_before_the_gradient_norm():
    assert nonfinite_quantity(1.0, 2.0, scaler_checks_gradients=False) is None
    assert nonfinite_quantity(math.nan, math.inf, False) == "loss became nan"
    assert nonfinite_quantity(-math.inf, 1.0, False) == "loss became -inf"
    assert nonfinite_quantity(1.0, math.inf, False) == "gradient norm became inf"


def test_with_a_gradient_scaler_only_the_loss_counts():
    """fp16: inf/nan gradients are the scaler's signal to skip and lower its scale."""
    assert nonfinite_quantity(1.0, math.inf, scaler_checks_gradients=True) is None
    assert nonfinite_quantity(1.0, math.nan, scaler_checks_gradients=True) is None
    assert nonfinite_quantity(math.nan, 1.0, scaler_checks_gradients=True) == "loss became nan"
    assert _guard(scaler=True).judge(1, 0.5, math.inf) is Verdict.APPLY


def test_stop_names_the_step_the_last_checkpoint_and_the_remedies():
    guard = _guard(max_grad_norm=None)
    assert guard.judge(1, 0.5, 2.0) is Verdict.APPLY
    assert guard.judge(2, math.nan, math.nan) is Verdict.STOP
    error = guard.diverged(2)
    assert error.exit_code == 3
    assert str(error) == ("loss became nan at step 2; last finite checkpoint: none was saved; "
                          "lower optimizer.lr (now 10.0), set train.max_grad_norm, or use "
                          "train.on_nonfinite=skip")
    guard.last_checkpoint = Path("run/checkpoints/step-1")
    assert "; last finite checkpoint: run/checkpoints/step-1; " in str(guard.diverged(2))


def test_layerwise_runs_are_not_offered_skip_nor_clipping_they_have():
    guard = _guard(optimizer={"lr": 1.0, "layerwise": True})
    assert guard.judge(4, 1.0, math.inf) is Verdict.STOP
    assert str(guard.diverged(4)) == ("gradient norm became inf at step 4; last finite "
                                      "checkpoint: none was saved; lower optimizer.lr (now 1.0)")


def test_skip_counts_and_stops_after_the_allowed_skips_in_a_row():
    guard = _guard(on_nonfinite="skip", max_consecutive_skips=2)
    verdicts = []
    with pytest.warns(UserWarning, match=r"loss became nan at step \d; its update was skipped"):
        for step, loss in enumerate([1.0, math.nan, math.nan, 1.0, math.nan, math.nan, math.nan],
                                    start=1):
            verdicts.append(guard.judge(step, loss, 1.0))
    S, A = Verdict.SKIP, Verdict.APPLY
    assert verdicts == [A, S, S, A, S, S, Verdict.STOP]
    assert guard.skipped_steps == 4
    message = str(guard.diverged(7))
    assert message.startswith("loss became nan at step 7 after 2 skipped steps in a row "
                              "(train.max_consecutive_skips=2); last finite checkpoint: ")
    assert "train.on_nonfinite=skip" not in message


def test_the_first_nonfinite_trainable_weight_is_named():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    assert first_nonfinite_weight(model) is None
    with torch.no_grad():
        model[1].bias[1] = math.inf
        model[0].weight[2, 0] = math.nan
    assert first_nonfinite_weight(model) == "0.weight"
    model[0].weight.requires_grad_(False)  # frozen weights are not trained, so not checked
    assert first_nonfinite_weight(model) == "1.bias"


def test_check_weights_raises_diverged_naming_the_weight():
    guard = _guard()
    model = nn.Linear(2, 2)
    guard.check_weights(model, 3)
    with torch.no_grad():
        model.weight.fill_(-math.inf)
    with pytest.raises(TrainingDiverged) as raised:
        guard.check_weights(model, 3)
    assert str(raised.value) == ("weights became non-finite (weight first) by step 3 although "
                                 "the loss and gradient norm were finite; last finite "
                                 "checkpoint: none was saved; lower optimizer.lr (now 10.0)")
