"""An optimizer's own keys (``OptimizerSpec.own``): sgd's optimizer.momentum is written as an
optimizer.* key, handed to torch, kept in config.yaml, resumed, planned as the state it
makes, range-checked at load, and ignored (with a warning) under another optimizer."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from cli_helpers import losses_resumed_at_step_2, optimizer_run, run_in_process

from memfit._utils.errors import ConfigError
from memfit.config.fields import is_own_keys
from memfit.config.ignored import IgnoredKeyWarning
from memfit.config.load import to_mapping
from memfit.config.overrides import with_overrides
from memfit.config.schema import OptimizerConfig
from memfit.monitor.metrics import losses_by_step, read_metrics
from memfit.techniques.config_checks import from_mapping
from memfit.techniques.optimizers.registry import SPECS
from memfit.techniques.own_keys import names

BASE = {"model": {"preset": "tiny-llama"}, "data": {"path": "unused"}}


def _config(**optimizer):
    return from_mapping({**BASE, "optimizer": optimizer})


def test_sgd_momentum_trains_resumes_and_is_planned_as_one_buffer_a_parameter(
        tmp_path: Path, instructions: Path, quiet_transformers) -> None:
    _, run_dir = optimizer_run(tmp_path, instructions, "{name: sgd, momentum: 0.9, lr: 0.01}")
    result = run_in_process("train", "run.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    saved = (run_dir / "config.yaml").read_text()
    assert "  momentum: 0.9\n" in saved and "own" not in saved  # a key of optimizer itself
    uninterrupted = losses_by_step(read_metrics(run_dir))

    # Resumed from step 2 with its momentum buffers = uninterrupted.
    resumed = losses_resumed_at_step_2(run_dir, tmp_path)
    assert resumed == pytest.approx({s: uninterrupted[s] for s in (3, 4)}, rel=1e-6)

    with_momentum = run_in_process("plan", "run.yaml", "--budget", "1GiB", "--json",
                                   cwd=tmp_path)
    plain = run_in_process("plan", "run.yaml", "optimizer.momentum=0", "--budget", "1GiB",
                           "--json", cwd=tmp_path)
    assert with_momentum.returncode == 0 and plain.returncode == 0, with_momentum.stderr
    state = json.loads(with_momentum.stdout)["config"]["bytes"]["optimizer"]
    assert json.loads(plain.stdout)["config"]["bytes"]["optimizer"] == 0
    assert state == 4 * _tiny_llama_size()  # one fp32 buffer per trainable parameter


def _tiny_llama_size() -> int:
    import torch
    from transformers import LlamaForCausalLM

    from memfit.models.presets import PRESETS

    with torch.device("meta"):
        return sum(p.numel() for p in LlamaForCausalLM(PRESETS["tiny-llama"]()).parameters())


def test_a_value_outside_the_keys_limits_is_one_line_naming_them():
    with pytest.raises(ConfigError, match=r"^optimizer.momentum=1.5 is outside 0.0 to 1.0 "
                                          r"\(a key of optimizer.name=sgd\)$"):
        _config(name="sgd", momentum=1.5)
    with pytest.raises(ConfigError, match="optimizer.momentum must be a number"):
        _config(name="sgd", momentum="lots")


def test_a_key_no_optimizer_declares_is_unknown_with_the_valid_ones():
    with pytest.raises(ConfigError) as raised:
        _config(name="sgd", momentun=0.9)
    message = str(raised.value)
    assert message.startswith("unknown key optimizer.momentun; did you mean "
                              "optimizer.momentum? (valid keys here: name, kwargs, lr,")
    # the shared keys, then every key an optimizer declares (a new one's too), sorted
    declared = sorted({key for spec in SPECS.values() for key in names(spec.own)})
    assert message.endswith(f"galore, {', '.join(declared)})") and "momentum" in declared
    with pytest.raises(ConfigError, match="unknown key optimizer.own"):
        _config(name="sgd", own={"momentum": 0.9})


def test_another_optimizers_own_key_is_ignored_with_a_warning():
    with pytest.warns(IgnoredKeyWarning, match=r"optimizer.momentum=0.9 is ignored: "
                                               r"optimizer.name=adamw does not read it"):
        config = _config(name="adamw", momentum=0.9)
    assert config.optimizer.own == {"momentum": 0.9}


def test_own_keys_are_written_as_keys_of_the_section_and_read_back():
    config = _config(name="sgd", momentum=0.9)
    mapping = to_mapping(config)
    assert mapping["optimizer"]["momentum"] == 0.9 and "own" not in mapping["optimizer"]
    assert from_mapping(mapping) == config
    assert with_overrides(config, {"optimizer.momentum": 0.5}).optimizer.own == {
        "momentum": 0.5}


def test_no_optimizer_declares_a_shared_key_as_its_own():
    shared = {entry.name for entry in dataclasses.fields(OptimizerConfig)
              if not is_own_keys(entry)}
    for spec in SPECS.values():
        assert not shared & set(names(spec.own)), spec.name
