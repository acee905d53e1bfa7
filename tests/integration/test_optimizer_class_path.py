"""optimizer.name as a class path: any torch.optim.Optimizer trains, is planned from one
step on fake tensors, and every way of naming it wrongly is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_helpers import (
    assert_one_line_error,
    losses_resumed_at_step_2,
    optimizer_run,
    run_in_process,
    tiny_run_arguments,
)

from memfit.monitor.metrics import losses_by_step, read_metrics
from memfit.plan import costs
from memfit.techniques.config_checks import from_mapping

OPTIMIZER_FILE = '''
import torch


class SignSGD(torch.optim.Optimizer):
    """Steps by the sign of a momentum buffer (one buffer per parameter)."""

    def __init__(self, params, lr=1e-3, beta=0.9):
        super().__init__(params, {"lr": lr, "beta": beta})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                buffer = self.state[p].setdefault("buffer", torch.zeros_like(p))
                buffer.mul_(group["beta"]).add_(p.grad, alpha=1 - group["beta"])
                p.add_(buffer.sign(), alpha=-group["lr"])
'''


def test_a_class_path_optimizer_trains_resumes_and_the_plan_counts_its_state(
        tmp_path: Path, instructions: Path, quiet_transformers) -> None:
    (tmp_path / "sign_sgd.py").write_text(OPTIMIZER_FILE)
    _, run_dir = optimizer_run(tmp_path, instructions,
                               "{name: sign_sgd.py:SignSGD, kwargs: {beta: 0.5}, lr: 0.001}")
    result = run_in_process("train", "run.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    saved = (run_dir / "config.yaml").read_text()
    assert f"name: {tmp_path / 'sign_sgd.py'}:SignSGD" in saved  # resolved beside the YAML
    uninterrupted = losses_by_step(read_metrics(run_dir))

    # Resume from step 2 (its momentum buffers restored) = uninterrupted, from elsewhere.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    resumed = losses_resumed_at_step_2(run_dir, elsewhere, "--trust-code")
    assert resumed == pytest.approx({s: uninterrupted[s] for s in (3, 4)}, rel=1e-6)

    planned = run_in_process("plan", "run.yaml", "--budget", "1GiB", "--json", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    # One fp32 buffer per trainable parameter, learned from one step on fake tensors.
    assert json.loads(planned.stdout)["config"]["bytes"]["optimizer"] == 4 * _tiny_llama_size()


def _tiny_llama_size() -> int:
    from transformers import LlamaForCausalLM

    from memfit.models.presets import PRESETS

    with torch.device("meta"):
        return sum(p.numel() for p in LlamaForCausalLM(PRESETS["tiny-llama"]()).parameters())


def test_the_plan_of_a_class_path_optimizer_is_its_real_state() -> None:
    from transformers import LlamaForCausalLM

    from memfit.models.presets import PRESETS
    from memfit.techniques.optimizers import OptimizerSetting, build_optimizer

    config = from_mapping({"model": {"preset": "tiny-llama"}, "data": {"path": "unused"},
                           "optimizer": {"name": "torch.optim:SGD",
                                         "kwargs": {"momentum": 0.9}}})
    model, setting = LlamaForCausalLM(PRESETS["tiny-llama"]()), OptimizerSetting.of(config)
    planned = costs.optimizer_cost(costs.trainable_params(model, setting), setting).state_bytes
    optimizer = build_optimizer(model, setting)
    assert type(optimizer) is torch.optim.SGD and optimizer.defaults["momentum"] == 0.9
    for param in model.parameters():
        param.grad = torch.ones_like(param)
    optimizer.step()
    real = sum(v.numel() * v.element_size() for state in optimizer.state.values()
               for v in state.values() if isinstance(v, torch.Tensor))
    assert planned == real == sum(p.numel() * 4 for p in model.parameters())


@pytest.mark.parametrize(("name", "kwargs", "command", "fragments"), [
    ("adamw9", {}, "train", ("optimizer.name='adamw9' is not one of: adamw", "class path")),
    ("no_such_module:Thing", {}, "train", ("optimizer.name='no_such_module:Thing'",
                                           "cannot import")),
    ("torch.nn:Linear", {}, "train", ("is not a torch.optim.Optimizer subclass",)),
    ("torch.optim:SGD", {"momentun": 0.9}, "train", ("refused optimizer.kwargs",
                                                     "momentun")),
    # Adafactor reads its step count with .item(): it cannot step on fake tensors.
    ("torch.optim:Adafactor", {}, "plan --budget 1GiB",
     ("cannot plan optimizer.name='torch.optim:Adafactor'",)),
])
def test_a_wrong_class_path_is_one_line(tmp_path: Path, instructions: Path, name: str,
                                        kwargs: dict, command: str,
                                        fragments: tuple[str, ...]) -> None:
    arguments = tiny_run_arguments(instructions, tmp_path / "run", f"optimizer.name={name}",
                                   f"optimizer.kwargs={json.dumps(kwargs)}")
    result = run_in_process(*command.split(), *arguments, cwd=tmp_path)
    assert_one_line_error(result, 2, *fragments)
    assert not (tmp_path / "run").exists()


MEMO_OPTIMIZER = '''
import torch


class Memo:
    count = 0


class MemoSGD(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.state[p].setdefault("memo", Memo())
                    p.add_(p.grad, alpha=-group["lr"])
'''


def test_state_a_checkpoint_cannot_restore_stops_after_the_first_step(
        tmp_path: Path, instructions: Path) -> None:
    """Found at the first checkpoint instead, it was a pickling traceback after every step
    before it had run."""
    (tmp_path / "memo_sgd.py").write_text(MEMO_OPTIMIZER)
    arguments = tiny_run_arguments(instructions, tmp_path / "run", "train.max_steps=50",
                                   f"optimizer.name={tmp_path / 'memo_sgd.py'}:MemoSGD",
                                   "log.tensorboard=false")
    result = run_in_process("train", *arguments, cwd=tmp_path)
    assert_one_line_error(result, 2, "keeps a Memo in its state ('memo')",
                          "torch.load(weights_only=True)")
    logged = [record["step"] for record in read_metrics(tmp_path / "run") if "loss" in record]
    assert logged == []  # stopped inside step 1, before it was logged
