"""`memfit bench` end to end on CPU: two cases (a peer and memfit) in their own processes,
the table printed and written, the PNGs decodable; bad input and the GPU check's refusal
without CUDA."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from cli_helpers import cli_env, run_in_process
from matplotlib.image import imread

from memfit.cli import main

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.xfail(strict=True, reason=(
    "since log.memory_every=N measures steps with step % N == 0 and memfit's own runs meter "
    "batches as the loop passes them, memfit's measured peak and the PyTorch AdamW peer's "
    "differ by 5.2% (5,206,040 vs 4,948,120 B): the harness must measure the same steps"))
def test_bench_runs_each_case_and_writes_the_table(tmp_path: Path):
    out = tmp_path / "bench"
    # The cases run in processes of their own (memfit.bench.process); the CLI need not.
    result = run_in_process("bench", "--suite", "memory", "--model", "tiny-llama", "--steps",
                            "2", "--cases", "PyTorch AdamW,memfit LoRA", "--out", str(out),
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "| case | weights | grads | optimizer | activations | temporaries | peak |" \
        in result.stdout
    table = (out / "bench.md").read_text()
    assert table.strip() in result.stdout
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()
            if line.startswith("| ")}
    assert {"PyTorch AdamW", "memfit LoRA"} <= set(rows)
    assert "| 1.00 |" in rows["PyTorch AdamW"]  # the baseline's own ratios
    results = json.loads((out / "results.json").read_text())
    for case in results["cases"]:
        assert case["note"] is None
        assert [r["step"] for r in case["records"]] == [1, 2]
        assert all(r["memory_peak_bytes"] > 0 for r in case["records"])  # every step measured
        measured = max(r["memory_peak_bytes"] for r in case["records"])
        # The CPU meter counts exactly what the planner predicts for these two.
        assert abs(case["plan_peak_tensor_bytes"] - measured) / measured < 0.02, case["name"]
    for picture in ("memory.png", "loss.png", "memory_over_steps.png"):
        assert imread(out / picture).ndim == 3
    assert (out / "runs" / "memfit-lora" / "metrics.jsonl").is_file()  # memfit.train's run


def test_bad_suite_is_one_line_naming_the_choices(tmp_path: Path, capsys):
    # In-process through the CLI's main: the same parsing and error printing, no start-up.
    assert main(["bench", "--suite", "fast", "--out", str(tmp_path / "b")]) == 2
    assert capsys.readouterr().err.strip() == (
        "memfit: error: --suite 'fast' is not one of: memory, speed, quality, all")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_gpu_check_fails_fast_without_cuda(tmp_path: Path):
    result = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"),
                             str(tmp_path / "gpu")], capture_output=True, text=True,
                            env=cli_env(), cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert "needs a CUDA GPU" in result.stderr
    assert not (tmp_path / "gpu").exists()
