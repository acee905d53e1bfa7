"""Building a run with adapters prints the adapter map once and keeps it on the Run for
the run folder; without adapters there is no map."""

from __future__ import annotations

import json

import pytest

from memfit.techniques.config_checks import load_config
from memfit.training.build import build_run


@pytest.fixture
def rows(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say {word}", "response": word}) + "\n"
                            for word in ["apple", "river", "stone", "cloud"] * 2))
    return path


def tiny_llama(rows, *overrides: str):
    return load_config(None, ["model.preset=tiny-llama", f"data.path={rows}",
                              "data.format=instruction", "data.max_length=32", *overrides])


def test_build_run_prints_the_adapter_map_and_keeps_it(rows, capsys):
    run = build_run(tiny_llama(rows, "adapter.kind=lora", "adapter.targets=[attention-qv]"))
    printed = capsys.readouterr().err
    assert run.adapter_map is not None
    assert f"memfit: {run.adapter_map.to_text()}" in printed
    assert [group.pattern for group in run.adapter_map.adapted] == [
        "model.layers.*.self_attn.q_proj", "model.layers.*.self_attn.v_proj"]
    assert run.adapter_map.trainable_parameters == sum(p.numel()
                                                       for p in run.trainable_parameters)


def test_build_run_without_adapters_has_no_map(rows, capsys):
    run = build_run(tiny_llama(rows))
    assert run.adapter_map is None
    assert "memfit: adapters on" not in capsys.readouterr().err
