"""Helpers for the distributed tests: a tiny text data set, run configs for the tiny Llama,
and the real CLI (``memfit train --nproc 2`` starts torch.distributed.run with 2 gloo
processes on this CPU)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent


def write_text_rows(path: Path, rows: int = 40) -> Path:
    """Documents of different lengths (so padding and token counts differ per rank)."""
    words = ["north", "amber", "quartz", "meadow", "signal", "harbor", "linen", "cedar"]
    with path.open("w") as handle:
        for index in range(rows):
            text = " ".join(words[(index * 3 + k) % len(words)] for k in range(3 + index % 7))
            handle.write(json.dumps({"text": text}) + "\n")
    return path


def run_config(tmp_path: Path, name: str, data: Path, **sections: dict | str) -> Path:
    """A YAML config for the tiny Llama on ``data`` writing to tmp_path/name; ``sections``
    update the YAML sections (train={...}, adapter={...}) or set top-level keys
    (precision="bf16")."""
    mapping = {
        "model": {"preset": "tiny-llama"},
        "data": {"path": str(data), "format": "text",
                 "max_length": 32, "pack": False, "eval_fraction": 0.1},
        "train": {"output_dir": str(tmp_path / name), "max_steps": 4,
                  "gradient_accumulation_steps": 2, "save_every": 2, "warmup_steps": 1},
        "optimizer": {"lr": 1e-3},
        "log": {"progress": False, "tensorboard": False},
    }
    for section, values in sections.items():  # a top-level key (precision) or a section
        mapping[section] = {**mapping.get(section, {}), **values} if isinstance(values, dict) \
            else values
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(mapping))
    return path


def memfit_environment() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    # The factory module of the failing-rank test is importable by every worker.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    return env


def memfit(*arguments: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memfit", *arguments], cwd=cwd,
                          capture_output=True, text=True, env=memfit_environment(),
                          timeout=timeout)


def on_two_processes(script: str, *arguments: str, cwd: Path, timeout: float = 900,
                     nproc: int = 2) -> subprocess.CompletedProcess:
    """``script`` (a file beside these helpers) run by torchrun as ``nproc`` (2) gloo
    processes."""
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={nproc}",
         "--max-restarts=0", str(HERE / script), *arguments],
        cwd=cwd, env=memfit_environment(), capture_output=True, text=True, timeout=timeout)


def interrupted_copy(root: Path, run: str, processes: int, last_step: int,
                     global_batch: int = 8) -> tuple[Path, Path]:
    """``run`` as if it had stopped before its step-``last_step`` checkpoint (that one, the
    export and the records removed), and the config that resumes it on ``processes``
    processes with the same global batch."""
    copy = root / f"{run}-resumed-on-{processes}"
    shutil.copytree(root / run, copy)
    shutil.rmtree(copy / "checkpoints" / f"step-{last_step}")
    for export in ("adapter", "model"):
        shutil.rmtree(copy / export, ignore_errors=True)
    (copy / "metrics.jsonl").write_text("")
    (copy / "summary.json").unlink()
    mapping = yaml.safe_load((copy / "config.yaml").read_text())
    mapping["train"]["micro_batch_size"] = global_batch // processes
    mapping["distributed"]["nproc"] = processes
    config = root / f"{copy.name}.yaml"
    config.write_text(yaml.safe_dump(mapping))
    return copy, config
