"""The peers' builders and the scripts' case builders, on a tiny random Llama folder: each
reads its numbers from the config it is given."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from memfit.bench.peer_models import BUILDERS, Recipe, _galore_groups, galore_settings
from memfit.bench.random_llama import LlamaShape, llama_config, save_random_model
from memfit.bench.script_case import case_config, memfit_training, peer_training

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bench") / "llama"
    # vocab 512: no tokenizer files, so memfit's loader falls back to bytes, which need 256+.
    save_random_model(folder, llama_config(LlamaShape(hidden=32, layers=2, heads=4,
                                                      intermediate=64, vocab=512)))
    return folder


def test_adam_peers_take_the_configs_numbers(folder: Path):
    config = case_config(folder, {"optimizer.lr": 1e-4, "optimizer.weight_decay": 0.01,
                                  "optimizer.eps": 1e-6})
    built = peer_training("torch-adamw", folder, config, CPU)
    (group,) = built.optimizer.param_groups
    assert (group["lr"], group["weight_decay"], group["eps"]) == (1e-4, 0.01, 1e-6)
    assert len(group["params"]) == len(list(built.model.parameters()))


def test_galore_projects_the_attention_and_mlp_matrices(folder: Path):
    model = BUILDERS["torch-adamw"](folder, Recipe.of(case_config(folder, {})), CPU).model
    other, projected = _galore_groups(model)
    # 2 layers x (q, k, v, o, gate, up, down); the embedding, head and norms are not.
    assert len(projected) == 14 and all(p.dim() == 2 for p in projected)
    assert len(other) + len(projected) == len(list(model.parameters()))
    settings = galore_settings(case_config(folder, {"optimizer.name": "galore",
                                                    "optimizer.galore.rank": 4}).optimizer.galore)
    assert settings["rank"] == 4 and settings["proj_type"] == "std"


def test_peft_lora_trains_only_the_adapters_of_the_configs_rank(folder: Path):
    config = case_config(folder, {"adapter.kind": "lora", "adapter.rank": 2})
    built = peer_training("peft", folder, config, CPU)
    trainable = [name for name, p in built.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    assert built.model.peft_config["default"].r == 2


def test_memfit_training_goes_through_memfits_stages(folder: Path):
    config = case_config(folder, {"precision": "bf16-pure"})
    built = memfit_training(config, CPU)
    assert {p.dtype for p in built.model.parameters()} == {torch.bfloat16}
    assert built.optimizer is not None
