"""The case registry and the checks ``run_bench`` makes before starting any process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from memfit._utils.errors import ConfigError
from memfit.bench import run_bench
from memfit.bench.cases import BASELINE, BY_NAME, CASES, GROUPS, select
from memfit.bench.models import MODELS
from memfit.bench.peers import PEERS
from memfit.bench.runner import base_mapping, case_mapping, memory_every, slug
from memfit.techniques.config_checks import from_mapping


@pytest.mark.parametrize("case", CASES, ids=lambda case: slug(case.name))
def test_every_case_is_a_valid_memfit_config(case, tmp_path: Path):
    base = base_mapping(MODELS["tiny-llama"], tmp_path / "model", tmp_path / "data.jsonl",
                        steps=2, every=1)
    config = from_mapping(case_mapping(base, case, tmp_path / "run"))
    assert config.train.output_dir == str(tmp_path / "run")
    assert config.train.max_steps == 2
    for key, value in case.overrides.items():
        section, *rest = key.split(".")
        node = getattr(config, section)
        for part in rest:
            node = getattr(node, part)
        assert str(node).lower() == str(value).lower(), key


def test_peers_name_a_loop_and_mirror_a_memfit_case():
    for case in CASES:
        if case.peer is None:
            assert case.mirrors is None
            continue
        assert case.peer in PEERS, case.name
        assert BY_NAME[case.mirrors].peer is None, case.name
        # a peer does the same job as the case it mirrors: the same config
        assert case.overrides == BY_NAME[case.mirrors].overrides, case.name
    assert BY_NAME[BASELINE].peer == "torch-adamw"


def test_groups_and_selection():
    assert [case.name for case in select(None)] == [case.name for case in CASES]
    for names in GROUPS.values():
        assert set(names) <= set(BY_NAME)
    chosen = select("gpu-check")
    assert {case.mirrors for case in chosen if case.peer} == \
        {case.name for case in chosen if case.peer is None}
    assert [c.name for c in select("memfit LoRA, PEFT LoRA")] == ["memfit LoRA", "PEFT LoRA"]
    with pytest.raises(ConfigError, match=r"--cases: 'nope' is not a case or group; choose"):
        select("memfit LoRA,nope")


def test_memory_measured_every_step_only_in_the_memory_suite():
    assert memory_every("memory", 3) == 1
    assert memory_every("all", 60) == 15
    assert memory_every("speed", 2) == 2


@pytest.mark.parametrize("arguments, message", [
    ({"suite": "fast"}, r"--suite 'fast' is not one of: memory, speed, quality, all"),
    ({"steps": 0}, r"--steps must be a positive integer, got 0"),
    ({"model": "gpt-5"}, r"--model 'gpt-5' is not one of: demo-base, tiny-llama, llama-1b"),
])
def test_bad_input_fails_before_anything_runs(arguments, message, tmp_path: Path):
    with pytest.raises(ConfigError, match=message):
        run_bench(out=tmp_path / "out", **arguments)
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_the_gpu_check_model_needs_cuda(tmp_path: Path):
    with pytest.raises(ConfigError, match="--model llama-1b needs a CUDA GPU"):
        run_bench("speed", "llama-1b", tmp_path / "out", cases="gpu-check")
