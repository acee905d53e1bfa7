"""Which GaLore configurations take projected gradients from backward."""

from __future__ import annotations

import pytest
from torch import nn

from memfit.optim import GaLore, LayerwiseOptimizer
from memfit.techniques.config_checks import from_mapping
from memfit.techniques.optimizers import OptimizerSetting, build_optimizer


def _model() -> nn.Module:
    model = nn.Module()
    model.up = nn.Linear(32, 64)
    model.down = nn.Linear(64, 32)
    model.lm_head = nn.Linear(32, 100)  # output heads are never projected
    return model


def _routed(model: nn.Module) -> list[str]:
    return sorted(name for name, module in model.named_modules() if "forward" in vars(module))


def _build(model: nn.Module, optimizer: dict, **top) -> object:
    config = from_mapping({"model": {"preset": "tiny-llama"}, "data": {"path": "rows.jsonl"},
                           "optimizer": {"name": "galore", "galore": {"rank": 8}, **optimizer},
                           **top})
    return build_optimizer(model, OptimizerSetting.of(config))


@pytest.mark.parametrize("layerwise", [False, True])
def test_default_galore_routes_projected_linear_layers(layerwise):
    model = _model()
    built = _build(model, {"layerwise": layerwise})
    assert isinstance(built, LayerwiseOptimizer if layerwise else GaLore)
    assert _routed(model) == ["down", "up"]


@pytest.mark.parametrize(("optimizer", "top"), [
    ({"galore": {"rank": 8, "project_in_backward": False}}, {}),
    ({"galore": {"rank": 8, "projector": "online"}}, {}),
    ({"galore": {"rank": 8, "projector": "random"}}, {}),
    ({}, {"precision": "fp16"}),
    ({}, {"memory": {"optimizer_offload": True}}),
])
def test_galore_keeps_full_gradients_where_a_step_needs_them(optimizer, top):
    model = _model()
    built = _build(model, optimizer, **top)
    assert isinstance(built, GaLore | LayerwiseOptimizer)
    assert _routed(model) == []
