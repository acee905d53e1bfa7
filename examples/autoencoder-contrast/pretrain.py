"""Step 1 of the example: make the data and pretrain the autoencoder on the source contrast.

    python examples/autoencoder-contrast/pretrain.py

Writes data/phantoms.npy (512 synthetic 32x32 head phantoms), trains the conv-autoencoder
preset on them as they are (pretrain.yaml, through memfit itself, no adapter) and saves
its weights to pretrained/model.safetensors, which model.py's factory loads.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

import memfit
from memfit.data.phantoms import random_phantoms
from memfit.monitor.metrics import read_metrics

HERE = Path(__file__).resolve().parent
IMAGES, SIZE = 512, 32


def main() -> None:
    (HERE / "data").mkdir(exist_ok=True)
    np.save(HERE / "data" / "phantoms.npy", random_phantoms(IMAGES, SIZE, seed=0))
    run_dir = HERE / "runs" / "pretrain"
    shutil.rmtree(run_dir, ignore_errors=True)
    config = memfit.load_config(HERE / "pretrain.yaml", [f"train.output_dir={run_dir}"])
    result = memfit.train(config)
    evals = [record for record in read_metrics(run_dir) if "eval_psnr" in record]
    print(f"source-contrast eval PSNR {evals[0]['eval_psnr']:.2f} -> "
          f"{evals[-1]['eval_psnr']:.2f} dB after {result.steps} steps")
    (HERE / "pretrained").mkdir(exist_ok=True)
    shutil.copy(run_dir / "model" / "model.safetensors", HERE / "pretrained" / "model.safetensors")
    print(f"saved {HERE / 'pretrained' / 'model.safetensors'}")


if __name__ == "__main__":
    main()
