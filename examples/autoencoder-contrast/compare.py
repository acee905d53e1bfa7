"""Step 3 of the example: how well does the autoencoder reconstruct the TARGET contrast
before adaptation, after LoRA, and after full fine-tuning — and what memory did each need?

    python examples/autoencoder-contrast/pretrain.py
    memfit train examples/autoencoder-contrast/adapt.yaml train.output_dir=runs/ae-lora
    python examples/autoencoder-contrast/compare.py runs/ae-lora

Fully fine-tunes the same pretrained model with the LoRA run's own config (adapter.kind=none,
its own learning rate) into RUN_DIR-full, unless that run exists. Then, on the eval split
of the target contrast (images the runs never trained on), prints PSNR and SSIM of the
pretrained, LoRA-adapted and fully fine-tuned models, and each run's peak tensor bytes of
a training step as its metrics.jsonl logged them (memfit.monitor.memory), and writes
RUN_DIR/reconstructions.png: input / before / after LoRA / full fine-tuning.

The LoRA result is evaluated as `memfit merge RUN_DIR --out RUN_DIR-merged` hands it over
for a plain module: the adapters merged into the weights, a state dict loaded into the
user's own model class with load_state_dict(strict=True).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import matplotlib
import torch
from safetensors.torch import load_file
from torch import nn

import memfit
from memfit.config import Config
from memfit.data import build_datasets, collate
from memfit.merge import merge_run
from memfit.monitor.memory import CATEGORIES, RECORD_PEAK_KEY, record_key
from memfit.monitor.metrics import read_metrics
from memfit.training.image_metrics import psnr, ssim

sys.path.insert(0, str(Path(__file__).resolve().parent))
import model as user_model  # noqa: E402 -- the example's factory module, beside this file

FULL_FINETUNE_LR = 3e-3  # full fine-tuning moves every weight: a smaller step than LoRA's


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lora_run", type=Path, help="the run folder of adapt.yaml")
    lora_run = parser.parse_args().lora_run
    lora_config = memfit.load_config(lora_run / "config.yaml", [])
    full_run = lora_run.with_name(lora_run.name + "-full")
    full_overrides = ["adapter.kind=none", f"optimizer.lr={FULL_FINETUNE_LR}"]
    if not (full_run / "summary.json").is_file():
        shutil.rmtree(full_run, ignore_errors=True)
        print(f"full fine-tuning into {full_run}/ ...", flush=True)
        memfit.train(memfit.load_config(lora_run / "config.yaml",
                                        [*full_overrides, f"train.output_dir={full_run}"]))

    models = {"before (pretrained)": user_model.pretrained(),
              "after LoRA (merged)": trained_weights(
                  # The run is the user's own, trained from this example's model.py.
                  merge_run(lora_run, lora_run.with_name(f"{lora_run.name}-merged"),
                            force=True, trust_code=True) / "model.safetensors"),
              "full fine-tuning": trained_weights(full_run / "model" / "model.safetensors")}
    images = eval_images(lora_config)
    memory = {"after LoRA (merged)": peak_memory(lora_run),
              "full fine-tuning": peak_memory(full_run)}
    trainable = {"after LoRA (merged)": trainable_parameters(lora_run),
                 "full fine-tuning": trainable_parameters(full_run)}

    print(f"\ntarget contrast {list(lora_config.data.images.contrast)}, "
          f"{len(images)} eval images of {tuple(images.shape[1:])}")
    print(f"{'model':<22} {'PSNR dB':>8} {'SSIM':>7} {'trainable':>10} {'peak step MiB':>14}")
    reconstructions = {}
    with torch.no_grad():
        for name, model in models.items():
            reconstructions[name] = model.eval()(images)
            peak = memory.get(name)
            print(f"{name:<22} {psnr(reconstructions[name], images).mean():8.2f} "
                  f"{ssim(reconstructions[name], images).mean():7.3f} "
                  f"{trainable.get(name, '-'):>10} "
                  f"{f'{peak[RECORD_PEAK_KEY] / 2**20:.2f}' if peak else '-':>14}")
    for name, peak in memory.items():
        parts = ", ".join(f"{part} {peak[record_key(part)] / 2**20:.2f}" for part in CATEGORIES
                          if record_key(part) in peak)
        print(f"  {name}, peak MiB at step {peak['step']}: {parts}")
    grid = lora_run / "reconstructions.png"
    save_grid(grid, images[:6], reconstructions)
    print(f"wrote {grid}")


def eval_images(config: Config) -> torch.Tensor:
    """The eval split in the target contrast: (N, 1, 32, 32), also the reconstruction target
    (adapt.yaml sets no data.images.target_contrast)."""
    splits = build_datasets(config.data, None, seed=config.train.seed)
    return collate([splits.eval[i] for i in range(len(splits.eval))])["images"]


def trained_weights(weights: Path) -> nn.Module:
    model = user_model.architecture()
    model.load_state_dict(load_file(weights), strict=True)
    return model


def trainable_parameters(run_dir: Path) -> int:
    return json.loads((run_dir / "summary.json").read_text())["trainable_parameters"]


def peak_memory(run_dir: Path) -> dict[str, int]:
    """The measured training step with the highest peak (log.memory_every picks which
    steps are measured; step 1, where the optimizer creates its state, always is)."""
    steps = [record for record in read_metrics(run_dir)
             if "loss" in record and RECORD_PEAK_KEY in record]
    return max(steps, key=lambda record: record[RECORD_PEAK_KEY])


def save_grid(path: Path, images: torch.Tensor, reconstructions: dict[str, torch.Tensor]
              ) -> None:
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = {"input (target contrast)": images, **reconstructions}
    figure, axes = plt.subplots(len(images), len(columns),
                                figsize=(2 * len(columns), 2 * len(images)), squeeze=False)
    for column, (title, stack) in enumerate(columns.items()):
        axes[0, column].set_title(title, fontsize=8)
        for row in range(len(images)):
            axes[row, column].imshow(stack[row, 0].clamp(0, 1), cmap="gray", vmin=0, vmax=1)
            axes[row, column].axis("off")
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)


if __name__ == "__main__":
    main()
