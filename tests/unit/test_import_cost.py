"""A run that does not use a library does not import it: ``memfit train`` of a factory's
plain nn.Module on tensors, without adapters, imports neither peft (which imports
bitsandbytes, ~5 s together), nor transformers (~2.5 s), nor datasets (~1 s). Every
``memfit train`` process, and each worker of ``--nproc N``, would pay for them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

UNUSED = ("peft", "bitsandbytes", "transformers", "datasets")

FACTORY = """\
import torch.nn.functional as F
from torch import nn


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 1)

    def forward(self, inputs, targets):
        return F.mse_loss(self.head(inputs), targets)


def regressor():
    return Regressor()
"""

# Trains through the CLI, then names on its last line the unused libraries it imported.
TRAIN = """\
import sys
from memfit.cli import main
status = main(sys.argv[1:])
print("imported:", *(name for name in {unused!r} if name in sys.modules))
sys.exit(status)
"""


def test_a_factory_run_imports_no_library_it_does_not_use(tmp_path: Path):
    (tmp_path / "regressor.py").write_text(FACTORY)
    generator = np.random.default_rng(0)
    np.savez(tmp_path / "rows.npz", inputs=generator.normal(size=(8, 4)).astype(np.float32),
             targets=generator.normal(size=(8, 1)).astype(np.float32))
    config = tmp_path / "config.yaml"
    config.write_text(
        f"model: {{factory: '{tmp_path / 'regressor.py'}:regressor', task: custom}}\n"
        f"data: {{path: {tmp_path / 'rows.npz'}, format: tensors, eval_fraction: 0}}\n"
        f"train: {{output_dir: {tmp_path / 'run'}, max_steps: 2, micro_batch_size: 2}}\n"
        "log: {progress: false, tensorboard: false}\n")

    result = subprocess.run([sys.executable, "-c", TRAIN.format(unused=UNUSED), "train",
                             str(config)], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "imported:"
