"""Device profiles (#35 items 2 and 8): builtin GPUs from datasheets, this machine's
calibration cached and validated as data, and one-line errors for a bad --device or a
damaged, foreign or missing profile."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from cli_helpers import run_in_process

from memfit._utils.errors import ConfigError
from memfit.plan import estimate
from memfit.plan.calibrate import ARITHMETIC
from memfit.plan.devices import (
    BUILTIN,
    PROFILE_ENV,
    PROFILE_VERSION,
    _profile_from,
    cache_path,
    read_cached,
)
from memfit.plan.planned_device import planned_device
from memfit.plan.planner import load_plan_config, plan
from memfit.plan.step_time import step_time

FIXED = Path(__file__).resolve().parents[1] / "cpu_profile.json"
GIB = 2**30


def test_the_issues_gpus_are_builtin_with_their_memory():
    assert {"h100", "a100-40gb", "a100-80gb", "l4", "a10g", "rtx-4090", "rtx-3090",
            "t4"} <= set(BUILTIN)
    assert BUILTIN["a100-40gb"].memory_bytes == 40 * GIB
    for profile in BUILTIN.values():
        assert profile.source == "builtin" and profile.note
        rates = [rate for _, rate in profile.matmul["bfloat16"]]
        assert rates == sorted(rates)  # bigger products run closer to the peak
    # Without bf16 tensor cores a T4's bf16 matmuls run at its fp32 rate.
    assert BUILTIN["t4"].matmul["bfloat16"] == BUILTIN["t4"].matmul["float32"]


def test_a_named_gpu_plans_for_its_memory_and_profile():
    named = plan(load_plan_config(None, ["model.preset=tiny-llama"]), device="h100")
    assert named.budget_bytes == 80 * GIB and named.device == "cuda"
    assert named.profile.name == "h100" and named.to_json()["device_profile"] == {
        "name": "h100", "source": "builtin"}
    assert "h100 (builtin profile" in named.label
    # Large enough that the matmuls, not the per-op host cost, set the step's time.
    work = estimate(load_plan_config(None, ["model.preset=gpt2", "data.max_length=1024",
                                            "train.micro_batch_size=16"]), "cuda").work
    assert step_time(work, BUILTIN["h100"]).seconds < step_time(work, BUILTIN["t4"]).seconds


def test_an_unknown_device_is_one_line_naming_the_choices(tmp_path):
    result = run_in_process("plan", "model.preset=tiny-llama", "--device", "h200x", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert "--device 'h200x' is not one of: cuda, cpu, h100" in result.stderr
    bad = run_in_process("plan", "model.preset=tiny-llama", "--prefer", "cheap", cwd=tmp_path)
    assert bad.returncode == 2 and "quality" in bad.stderr


def test_a_profile_round_trips_through_its_json():
    profile = BUILTIN["l4"]
    assert _profile_from(json.loads(json.dumps(profile.to_json()))) == profile
    priced = dataclasses.replace(profile, element_seconds={"bernoulli_": 5e-9, "tanh": 0.0},
                                 memory_by_dtype={"bfloat16": ((4096.0, 1e9), (8192.0, 2e9))})
    assert _profile_from(json.loads(json.dumps(priced.to_json()))) == priced


@pytest.mark.parametrize("content, reason", [
    ("{not json", "damaged"),
    (json.dumps({"version": PROFILE_VERSION, "name": "cpu"}), "damaged"),
    (json.dumps({**BUILTIN["l4"].to_json(), "op_seconds": -1}), "damaged"),
    (json.dumps({**BUILTIN["l4"].to_json(), "memory": [[2, 1], [1, 1]]}), "damaged"),
    (json.dumps({**BUILTIN["l4"].to_json(), "element_seconds": {"tanh": -1}}), "damaged"),
    (json.dumps({**BUILTIN["l4"].to_json(), "element_seconds": [1]}), "damaged"),
    (json.dumps({**BUILTIN["l4"].to_json(), "memory_by_dtype": {"bfloat16": [[2, 1], [1, 1]]}}),
     "damaged"),
    (json.dumps({**BUILTIN["l4"].to_json(), "source": "calibrated"}), "for 'l4'"),
    (json.dumps(BUILTIN["l4"].to_json()), "for 'l4' (builtin)"),
])
def test_a_damaged_or_foreign_cache_is_one_error_naming_the_file(tmp_path, monkeypatch,
                                                                 content, reason):
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(PROFILE_ENV)
    path = cache_path("cpu")
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(ConfigError, match="calibration cache") as error:
        planned_device("cpu")
    assert str(path) in str(error.value) and reason in str(error.value)
    assert "memfit env --calibrate" in str(error.value)
    assert path.read_text() == content  # data, never rewritten behind the user's back


def test_a_cache_of_another_format_version_is_measured_again(tmp_path, monkeypatch):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"version": PROFILE_VERSION - 1}))
    assert read_cached(path, "cpu") is None


def test_a_missing_profile_file_is_one_error(tmp_path, monkeypatch):
    monkeypatch.setenv(PROFILE_ENV, str(tmp_path / "nope.json"))
    with pytest.raises(ConfigError, match="MEMFIT_DEVICE_PROFILE=.*no such file"):
        planned_device("cpu")


def test_env_calibrate_measures_and_plan_calibrates_once_on_first_use(tmp_path, monkeypatch):
    """~15 s: two plans and two real calibrations of this machine (what the test is)."""
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(PROFILE_ENV)
    first = run_in_process("plan", "model.preset=tiny-llama", "--device", "cpu", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "memfit: calibrated this machine's cpu once" in first.stderr
    assert cache_path("cpu").is_file()
    again = run_in_process("plan", "model.preset=tiny-llama", "--device", "cpu", cwd=tmp_path)
    assert "calibrated" not in again.stderr and " step " in again.stdout
    measured = run_in_process("env", "--calibrate", cwd=tmp_path)
    assert measured.returncode == 0, measured.stderr
    assert "matmul float32" in measured.stdout and str(cache_path("cpu")) in measured.stdout
    calibrated = read_cached(cache_path("cpu"), "cpu")
    assert calibrated.source == "calibrated"
    # Every op the calibration prices per value, and the 8-bit optimizer's update.
    assert set(calibrated.element_seconds) == {*ARITHMETIC, "adamw8bit"}
    assert all(seconds >= 0 for seconds in calibrated.element_seconds.values())
    assert set(calibrated.memory_by_dtype) == {"bfloat16"}
    assert json.loads(FIXED.read_text())["version"] == PROFILE_VERSION  # the suite's own
