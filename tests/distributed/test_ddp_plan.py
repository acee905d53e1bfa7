"""The planner under data parallel and FSDP2 against 2 gloo processes: ``plan --devices 2``'s bytes
per device at or above each rank's measured peak (the CPU tensor tracker's exact bytes)
and within 15%, and with FSDP2's host offload its host bytes against each rank's host
pool; ``memory.auto`` on 2 processes plans once for 2 devices and every rank trains that
choice, or the job stops with the planner's one line.

The measured cases run in ONE torchrun job (ddp_plan_jobs.py), sharing a start-up.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dist_factories import regression_config
from dist_helpers import HERE, memfit, memfit_environment, run_config

from memfit.config.load import read_yaml
from memfit.monitor.metrics import read_metrics
from memfit.plan import estimate
from memfit.techniques.config_checks import from_mapping

pytestmark = pytest.mark.slow

SEQUENCE = 64
GALORE = {"name": "galore", "galore": {"projector": "randomized_svd", "rank": 16,
                                       "update_gap": 2}}
# name -> config sections; GaLore at rank 16 (below the 64-wide matrices: really projected)
# refreshes its projector on steps 1 and 3 and takes R from backward on step 2.
CASES = {
    "adamw": {"optimizer": {"name": "adamw"}},
    "adamw-accumulate": {"optimizer": {"name": "adamw"},
                         "train": {"gradient_accumulation_steps": 2}},
    "adamw8bit": {"optimizer": {"name": "adamw8bit"}},
    "adafactor": {"optimizer": {"name": "adafactor"}},
    "galore": {"optimizer": GALORE},
    "layerwise-adamw": {"optimizer": {"name": "adamw", "layerwise": True}},
}
# The same under FSDP2, with what it trains besides AdamW (each rank's rows of the state).
_FSDP = {"distributed": {"strategy": "fsdp", "nproc": 2}}
CASES.update({f"fsdp-{name}": {**sections, **_FSDP} for name, sections in [
    ("adamw8bit", CASES["adamw8bit"]), ("adafactor", CASES["adafactor"]),
    ("galore", CASES["galore"]), ("layerwise-adamw", CASES["layerwise-adamw"]),
    ("layerwise-galore", {"optimizer": {**GALORE, "layerwise": True}}),
    ("adamw-offloaded", {"memory": {"optimizer_offload": True}}),
    ("qlora", {"adapter": {"kind": "qlora"}})]})  # the 4-bit base sharded too
# Cases planned below a rank's measured peak (none since 2026-12-02: adamw8bit, 1 KiB
# below while the spec omits bitsandbytes' 2 KiB of shared qmaps, is at or above it now
# that every step is measured and the peak is the largest moment's).
BELOW_MEASURED: dict[str, str] = {}
# Layer-wise updates under FSDP2 peak, as planned, at the "layer-wise update in backward"
# moment: the backward moment of the most activations (the trace's first gradient) with the
# largest (a root weight's) and a block's whole gradients, the reduce-scatter copy and the
# gathered units all beside it, though they are never alive at once; on this 2-layer model,
# whose measured peak is its forward's activations, that bound is 17% (adamw) and 20%
# (GaLore) above the measurement. On the 69M Llama of benchmarks/distributed.py it is 4-5%
# above (docs/planner.md).
ABOVE_15_PERCENT = {name: "layer-wise under fsdp: the 'layer-wise update in backward' moment "
                          "stacks worst cases on a 2-layer model"
                    for name in ("fsdp-layerwise-adamw", "fsdp-layerwise-galore")}


def write_long_rows(path: Path, rows: int = 48) -> Path:
    """Rows longer than SEQUENCE bytes: every example is cut to exactly SEQUENCE tokens, so
    no batch is padded (the planner assumes full-length sequences without a mask)."""
    words = ["north", "amber", "quartz", "meadow", "signal", "harbor", "linen", "cedar"]
    with path.open("w") as handle:
        for index in range(rows):
            text = " ".join(words[(index + k) % len(words)] for k in range(16))
            handle.write(json.dumps({"text": text}) + "\n")
    return path


def case_config(root: Path, name: str, data: Path, sections: dict) -> Path:
    train = {"max_steps": 3, "micro_batch_size": 2, "gradient_accumulation_steps": 1,
             "save_every": 0, "warmup_steps": 0, "max_grad_norm": 1.0,
             **sections.get("train", {})}
    distributed = sections.get("distributed", {"strategy": "ddp", "nproc": 2})
    path = run_config(root, name, data, **{**sections, "train": train, "distributed": distributed})
    mapping = yaml.safe_load(path.read_text())  # run_config's data section, full-length rows
    mapping["data"].update(max_length=SEQUENCE, eval_fraction=0.0)
    mapping["log"]["memory_every"] = 1  # the plan is the most of all 3 steps (GaLore: step 3)
    path.write_text(yaml.safe_dump(mapping))
    return path


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, tuple[Path, list[int], list[int | None]]]:
    """name -> (config, [rank 0's peak bytes, rank 1's], [their host pools' peaks])."""
    root = tmp_path_factory.mktemp("ddp-plan")
    data = write_long_rows(root / "rows.jsonl")
    configs = {name: case_config(root, name, data, sections) for name, sections in CASES.items()}
    (root / "configs.json").write_text(json.dumps([str(path) for path in configs.values()]))
    out = root / "peaks"
    out.mkdir()
    job = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "--max-restarts=0", str(HERE / "ddp_plan_jobs.py"), str(root / "configs.json"),
         str(out)],
        cwd=root, env=memfit_environment(), capture_output=True, text=True, timeout=600)
    assert job.returncode == 0, job.stderr[-4000:]
    ranks = {name: [json.loads((out / f"{name}.rank-{rank}.json").read_text())
                    for rank in (0, 1)] for name in configs}
    return {name: (path, [rank["peak_bytes"] for rank in ranks[name]],
                   [rank["host_peak_bytes"] for rank in ranks[name]])
            for name, path in configs.items()}


def planned_bytes(config: Path) -> int:
    return estimate(from_mapping(read_yaml(config)), "cpu").peak_tensor_bytes


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.xfail(reason=ABOVE_15_PERCENT[name], strict=True))
    if name in ABOVE_15_PERCENT else name for name in CASES])
def test_plan_per_device_is_within_15_percent_of_each_ranks_peak(measured, name: str):
    config, peaks, _ = measured[name]
    planned = planned_bytes(config)
    for peak in peaks:
        assert abs(planned / peak - 1) <= 0.15, (planned, peaks)


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.xfail(reason=BELOW_MEASURED[name], strict=True))
    if name in BELOW_MEASURED else name for name in CASES])
def test_plan_per_device_is_not_below_any_ranks_peak(measured, name: str):
    """Auto-fit relies on it: a plan below the measurement picks what runs out of memory."""
    config, peaks, _ = measured[name]
    assert planned_bytes(config) >= max(peaks), (planned_bytes(config), peaks)


def test_fsdp_host_offload_plan_is_each_ranks_host_pool(measured):
    """CPUOffloadPolicy's shards, their grads and AdamW's state, counted as host memory on
    CPU too (distributed/host_offload.py): the plan's host bytes are rank 0's (the largest
    chunks) exactly, at or above rank 1's, and within 15% of both."""
    config, _, hosts = measured["fsdp-adamw-offloaded"]
    planned = estimate(from_mapping(read_yaml(config)), "cpu").host_bytes
    assert planned == hosts[0] >= hosts[1] > 0.85 * planned, (planned, hosts)


def _auto_config(root: Path, name: str, micro_batch_size: int) -> Path:
    data = write_long_rows(root / "rows.jsonl")
    return case_config(root, name, data, {"train": {"max_steps": 2,
                                                    "micro_batch_size": micro_batch_size}})


def test_memory_auto_on_two_processes_trains_one_plan_for_two_devices(tmp_path: Path):
    config = _auto_config(tmp_path, "auto", micro_batch_size=2)
    budget = planned_bytes(config) - 1  # the config as given does not fit: the plan changes it
    result = memfit("train", str(config), "memory.auto=true", f"memory.budget={budget}",
                    "--nproc", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    chosen = [line for line in result.stderr.splitlines() if "memory.auto chose" in line]
    assert len(chosen) == 2 and chosen[0] == chosen[1]  # each rank says what it applied
    choice = json.loads((tmp_path / "auto" / "summary.json").read_text())["auto_fit"]
    # Planned for 2 devices (names carry the distribution) and trained as planned.
    strategy = choice["strategy"].partition(":")[0]
    assert strategy in ("ddp", "fsdp") and choice["overrides"]["distributed.nproc"] == 2
    resolved = yaml.safe_load((tmp_path / "auto" / "config.yaml").read_text())
    assert resolved["distributed"] == {"strategy": strategy, "nproc": 2, "sequence_parallel": 1}
    steps = [record["step"] for record in read_metrics(tmp_path / "auto") if "loss" in record]
    assert steps == [1, 2]  # within the budget each rank's tracker enforced


def test_memory_auto_with_nothing_fitting_stops_the_job_with_the_planners_line(tmp_path: Path):
    # A factory's regression: each rank stops with the planner's line, whatever the model
    # (the tiny Llama's 2-device plan alone took ~25 s of this test).
    config = regression_config(tmp_path, "auto-too-small", "ddp", micro_batch_size=1)
    result = memfit("train", str(config), "memory.auto=true", "memory.budget=1000",
                    "--nproc", "2", cwd=tmp_path)
    assert result.returncode != 0
    assert "memfit: error: no strategy fits 1000 B even at micro-batch 1" in result.stderr
    assert not (tmp_path / "auto-too-small").exists()
