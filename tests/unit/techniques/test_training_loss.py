"""The one loss dispatch training and the planner share: which loss each config trains
with, and a factory model's own loss as a sum over the micro-batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from memfit.techniques.config_checks import from_mapping
from memfit.techniques.training_loss import TrainingLoss


def _loss(mapping: dict) -> TrainingLoss:
    config = from_mapping(mapping)
    return TrainingLoss.of(config.model, config.memory)


def test_each_task_gets_its_loss(tmp_path):
    data = str(tmp_path)
    chunked = _loss({
        "model": {"preset": "tiny-llama"}, "data": {"path": data},
        "memory": {"chunked_loss": True, "loss_chunk_tokens": 32}})
    assert chunked == TrainingLoss(causal_lm=True, loss_chunk_tokens=32)
    images = _loss({
        "model": {"preset": "conv-autoencoder", "task": "autoencoder"},
        "data": {"path": data, "format": "images"}})
    assert images == TrainingLoss(causal_lm=False, reconstruction_loss="mse")
    custom = _loss({
        "model": {"factory": "torch.nn:Identity", "task": "custom"},
        "data": {"path": data, "format": "tensors"}})
    assert custom == TrainingLoss(causal_lm=False)


class MeanSquaredError(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 1)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.linear(inputs), targets)


def test_a_factory_models_mean_loss_is_summed_over_its_examples():
    model, generator = MeanSquaredError(), torch.Generator().manual_seed(0)
    batch = {"inputs": torch.randn(5, 3, generator=generator),
             "targets": torch.randn(5, 1, generator=generator)}
    loss = TrainingLoss(causal_lm=False).loss_sum(model, batch)
    torch.testing.assert_close(loss, 5 * model(**batch))


def test_a_factory_model_without_a_scalar_loss_is_refused():
    # nn.Linear's forward(input=...) returns the (2, 1) outputs, not a loss.
    with pytest.raises(TypeError, match="scalar loss tensor"):
        TrainingLoss(causal_lm=False).loss_sum(nn.Linear(3, 1), {"input": torch.zeros(2, 3)})
