"""Helpers for end-to-end tests: small data files, config files and a CLI runner.

A module of its own, not conftest.py: several test folders have a conftest, and
`from conftest import ...` would pick whichever pytest imported first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent


def write_instructions(path: Path, rows: int = 48) -> Path:
    """Variable-length prompt/response rows (lengths differ so padding matters)."""
    words = ["apple", "river", "stone", "cloud", "ember", "field", "glass", "honey"]
    with path.open("w") as handle:
        for index in range(rows):
            count = 1 + index % 5
            item = " ".join(words[(index + k) % len(words)] for k in range(count))
            handle.write(json.dumps({"prompt": f"Repeat twice: {item}",
                                     "response": f"{item} {item}"}) + "\n")
    return path


def cli_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    # Test helper modules (factories) are importable by the CLI subprocess.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    return env


def run_cli(*arguments: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memfit", *arguments], cwd=cwd,
                          capture_output=True, text=True, env=cli_env(), timeout=timeout)


def write_config(path: Path, mapping: dict) -> Path:
    path.write_text(yaml.safe_dump(mapping))
    return path


def tiny_run_arguments(data: Path, output_dir: Path, *extra: str) -> list[str]:
    """A config file for the tiny Llama preset on ``data`` (written beside the run folder),
    followed by ``extra`` key=value overrides."""
    config = output_dir.parent / f"{output_dir.name}.yaml"
    config.write_text(
        "model: {preset: tiny-llama}\n"
        f"data: {{path: {data}, format: instruction, max_length: 64}}\n"
        f"train: {{output_dir: {output_dir}}}\n"
        "log: {progress: false}\n")
    return [str(config), *extra]
