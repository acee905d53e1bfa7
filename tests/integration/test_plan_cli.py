"""`memfit plan` end to end: --json, and bad input (the table: tests/unit/plan)."""

from __future__ import annotations

import json

from cli_helpers import run_cli, run_in_process


def test_plan_json_is_one_object(tmp_path):
    # A budget every row fits (a smaller one adds the micro-batch search: 37 traces, not 16).
    result = run_in_process("plan", "model.preset=tiny-llama", "data.max_length=64",
                            "--budget", "1GiB", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert set(plan) == {"device", "device_assumed", "device_profile", "devices", "config",
                         "strategies", "skipped", "recommended", "recommended_step_seconds",
                         "reason"}
    assert set(plan["device_profile"]) >= {"name", "source"}


def test_plan_without_arguments_plans_the_demo_and_says_the_gpu_is_assumed(tmp_path):
    """As `memfit train` with no arguments trains the demo, `memfit plan` plans it; the
    header says what the plan is for, and that a GPU which is not here is assumed."""
    import torch

    from memfit.demo.defaults import demo_config_path

    result = run_in_process("plan", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    explicit = run_in_process("plan", str(demo_config_path()), "--json", cwd=tmp_path)
    assert plan == json.loads(explicit.stdout)
    assert plan["device"] == "cuda" and plan["device_assumed"] is not torch.cuda.is_available()
    header = run_in_process("plan", cwd=tmp_path).stdout.splitlines()[0]
    assert header.startswith("memfit plan: demo-base, micro-batch 8 x 128 tokens")
    if not torch.cuda.is_available():
        assert "for cuda (assumed: no GPU here; --device cpu to plan for this machine; " \
               "step times of a " in header and header.endswith("--device NAME for another)")
    on_cpu = run_in_process("plan", "--device", "cpu", cwd=tmp_path).stdout.splitlines()[0]
    assert "no budget, for cpu (cpu, step times " in on_cpu


def test_plan_without_a_budget_prints_every_strategy_quietly(tmp_path):
    """No --budget and no GPU to take it from (--device cpu): every strategy's bytes, no
    fits column, no recommendation; and nothing on stderr (transformers' notes, e.g.
    "use_cache=True is incompatible with gradient checkpointing", stay behind --debug)."""
    from memfit.plan import plan
    from memfit.plan.planner import load_plan_config
    from memfit.plan.strategies import strategies

    # test_plan_json_is_one_object's model and length: the library plan below finds their
    # traces in this process's cache.
    arguments = ["model.preset=tiny-llama", "data.max_length=64"]
    # A fresh interpreter: in this one, a library's say-once note may be spent already.
    result = run_cli("plan", *arguments, "--device", "cpu", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert "no budget, for cpu" in lines[0]
    header = lines[2].split()
    assert header[0] == "strategy" and header[-5:] == ["host", "step", "tok/s", "peak", "at"]
    assert "fits" not in header
    names = [name for name, _ in strategies(True, True)]
    assert [line.split()[0] for line in lines[4:4 + len(names)]] == names
    assert "recommended:" not in result.stdout and "--budget" in result.stdout
    # The same plan as the library gives it: no fits, no recommendation.
    planned = plan(load_plan_config(None, arguments), device="cpu")
    assert planned.budget_bytes is None and planned.recommended is None
    assert {row.fits for row in planned.strategies} == {None}
    assert planned.to_json()["strategies"][0]["fits"] is None


def test_plan_bad_budget_is_one_line_exit_2(tmp_path):
    result = run_in_process("plan", "model.preset=tiny-llama", "--budget", "lots", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("memfit: error: --budget")
    assert "Traceback" not in result.stderr


def test_plan_traces_a_factory_model_with_a_batch_from_its_data(tmp_path):
    from factories import write_regression_data

    write_regression_data(tmp_path / "reg.npz")
    result = run_in_process("plan", "model.factory=factories:regressor", "model.task=custom",
                            "data.format=tensors", f"data.path={tmp_path / 'reg.npz'}",
                            "train.micro_batch_size=4", "--budget", "1MiB", "--device", "cpu",
                            "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    # Linear(8, 32) + Linear(32, 1): 321 fp32 parameters.
    weights = 4 * (8 * 32 + 32 + 32 + 1)
    assert plan["config"]["bytes"]["weights"] == weights
    # At AdamW's step: weights, grads and two moments are live together.
    assert plan["config"]["peak_tensor_bytes"] >= 4 * weights


def test_plan_max_length_finds_the_longest_sequence_that_fits(tmp_path):
    from memfit.plan import estimate, with_overrides
    from memfit.plan.planner import load_plan_config

    arguments = ["model.preset=tiny-llama", "train.micro_batch_size=1"]
    result = run_in_process("plan", *arguments, "--budget", "1MiB", "--device", "cpu",
                            "--max-length", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert (found["context"], found["strategy"]) == (1024, "qlora+offload")
    length, overrides = found["max_length"], found["overrides"]
    assert overrides["data.max_length"] == length and 2 < length < 1024
    # Oracle: the plan of that strategy fits at the length found, and not one token more.
    config = load_plan_config(None, arguments)
    planned = [estimate(with_overrides(config, {**overrides, "data.max_length": tokens}),
                        device="cpu").device_bytes for tokens in (length, length + 1)]
    assert planned[0] <= 2**20 < planned[1]
    assert found["estimate"]["peak_tensor_bytes"] == planned[0]


def test_plan_max_length_over_two_devices_splits_each_sequence(tmp_path):
    """(Over 10 s: the search plans about 40 configurations of 2 devices, sharded and
    split, each a trace of the tiny model.)"""
    from memfit.plan import estimate, with_overrides
    from memfit.plan.planner import load_plan_config

    arguments = ["model.preset=tiny-llama", "train.micro_batch_size=1"]
    result = run_in_process("plan", *arguments, "--budget", "1MiB", "--device", "cpu",
                            "--max-length", "--devices", "2", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert (found["devices"], found["strategy"]) == (2, "fsdp-sp2:qlora+offload")
    length, overrides = found["max_length"], found["overrides"]
    assert {key: overrides[key] for key in ("distributed.strategy", "distributed.nproc",
                                            "distributed.sequence_parallel")} == {
        "distributed.strategy": "fsdp", "distributed.nproc": 2,
        "distributed.sequence_parallel": 2}
    # Oracle: the split fits at the length found and not one token more, where the same
    # strategy with whole sequences on each device does not fit.
    config = load_plan_config(None, arguments)

    def planned(tokens: int, split: int = 2) -> int:
        return estimate(with_overrides(config, {
            **overrides, "data.max_length": tokens,
            "distributed.sequence_parallel": split}), device="cpu").device_bytes

    assert planned(length) <= 2**20 < planned(length + 1)
    assert planned(length, split=1) > 2**20
