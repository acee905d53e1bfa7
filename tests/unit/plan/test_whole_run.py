"""A whole ``memfit.train`` call (load, quantization, steps, evaluation, checkpoint, export)
measured from outside by whole_run.measure_whole_run is at or below its plan."""

from __future__ import annotations

from accuracy_cases import whole_run_config, write_data
from whole_run import measure_whole_run

from memfit.plan import estimate


def test_a_qlora_whole_run_is_within_its_plan(tmp_path):
    config = whole_run_config(write_data(tmp_path), tmp_path, "gpt-neox", "qlora-r8")
    run = measure_whole_run(config, tmp_path / "run")
    planned = estimate(config, device="cpu").peak_tensor_bytes
    # The tracker outside sees everything the loop's meter sees, and more.
    assert run.step_peak_bytes <= run.peak_bytes <= planned
    assert {"loading the base", "training step", "evaluation", "saving the result"} <= set(
        run.phase_peaks)
