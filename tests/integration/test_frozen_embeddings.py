"""memory.freeze_embeddings: a full fine-tune whose input embedding and output layer (tied
or not) take no gradient and no optimizer state, trained, planned and refused as a user
would meet it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cli_helpers import run_cli, tiny_run_arguments
from safetensors.torch import load_file
from torch import nn

import memfit
from memfit._utils.errors import ConfigError
from memfit.config.ignored import IgnoredKeyWarning
from memfit.plan import estimate
from memfit.techniques.config_checks import from_mapping, load_config
from memfit.techniques.frozen_embeddings import check_applied, embedding_modules, freeze
from memfit.techniques.technique_options import TechniqueOptions
from memfit.training.build import load_base, prepare_model, seed_everything


def _config(**memory):  # noqa: ANN003, ANN202
    return from_mapping({"model": {"preset": "tiny-llama"}, "data": {"path": "unused"},
                         "memory": memory})


def test_a_tied_head_is_the_one_frozen_parameter() -> None:
    config = _config(freeze_embeddings=True)  # tiny-llama ties its head to the embedding
    model, warnings = prepare_model(load_base(config), TechniqueOptions.of(config))
    assert [name for name, p in model.named_parameters() if not p.requires_grad] == [
        "model.embed_tokens.weight"]
    assert warnings == []


def test_an_untied_head_is_frozen_beside_the_embedding_and_nothing_else() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = freeze(LlamaForCausalLM(LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, tie_word_embeddings=False)))
    assert [name for name, p in llama.named_parameters() if not p.requires_grad] == [
        "model.embed_tokens.weight", "lm_head.weight"]


def test_a_plain_module_freezes_its_embeddings_and_one_without_any_is_refused() -> None:
    module = freeze(nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 2)))
    assert [p.requires_grad for p in module.parameters()] == [False, True, True]
    with pytest.raises(ConfigError, match="found no embedding to freeze"):
        check_applied(nn.Linear(4, 2))
    thawed = nn.Sequential(nn.Embedding(10, 4))
    with pytest.raises(ConfigError, match="an embedding still trains"):
        check_applied(thawed)
    assert embedding_modules(thawed) == [thawed[0]]


def test_the_plan_drops_their_optimizer_state() -> None:
    plain, frozen = estimate(_config(), device="cpu"), estimate(
        _config(freeze_embeddings=True), device="cpu")
    # tiny-llama: one tied vocab 259 x hidden 64 fp32 matrix, without AdamW's 8 bytes of
    # moments per value and its 4-byte step counter (plan-accuracy measures the whole peak).
    assert plain.bytes["optimizer"] - frozen.bytes["optimizer"] == 8 * 259 * 64 + 4
    assert frozen.peak_tensor_bytes < plain.peak_tensor_bytes


def test_with_adapters_it_is_named_as_ignored() -> None:
    with pytest.warns(IgnoredKeyWarning, match="memory.freeze_embeddings=true is ignored: "
                      "adapter.kind=lora freezes every base weight already"):
        from_mapping({"model": {"preset": "tiny-llama"}, "data": {"path": "unused"},
                      "adapter": {"kind": "lora"}, "memory": {"freeze_embeddings": True}})


def test_training_leaves_them_as_they_were(tmp_path: Path, instructions: Path) -> None:
    path, *rest = tiny_run_arguments(instructions, tmp_path / "run", "data.eval_fraction=0",
                                     "log.tensorboard=false", "train.max_steps=3",
                                     "optimizer.lr=1e-2", "memory.freeze_embeddings=true")
    config = load_config(path, rest)
    seed_everything(config.train.seed)
    before = {name: p.detach().clone() for name, p in load_base(config).model.named_parameters()}
    result = memfit.train(config)
    after = load_file(result.output_dir / "model" / "model.safetensors")
    assert torch.equal(after["model.embed_tokens.weight"], before["model.embed_tokens.weight"])
    moved = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(after[moved], before[moved])


def test_two_fsdp_processes_leave_them_as_they_were(tmp_path: Path, instructions: Path) -> None:
    # FSDP2 shards the frozen embedding beside trainable weights of the same module tree.
    run = tmp_path / "run"
    result = run_cli("train", *tiny_run_arguments(
        instructions, run, "data.eval_fraction=0", "log.tensorboard=false", "train.max_steps=2",
        "optimizer.lr=1e-2", "memory.freeze_embeddings=true", "distributed.strategy=fsdp",
        "distributed.nproc=2"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    config = load_config(run / "config.yaml", [])
    seed_everything(config.train.seed)
    before = load_base(config).model.state_dict()
    after = load_file(run / "model" / "model.safetensors")
    assert torch.equal(after["model.embed_tokens.weight"], before["model.embed_tokens.weight"])
    moved = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(after[moved], before[moved])
