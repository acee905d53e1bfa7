"""The autoencoder-contrast example, short: a conv autoencoder pretrained on one contrast
is adapted through `memfit train` to another with LoRA (encoder-late + decoder), bf16,
gradient accumulation and activation checkpointing; PSNR on the target contrast improves,
and the merged result loads into the user's class with load_state_dict(strict=True)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from cli_helpers import run_in_process, write_config
from safetensors.torch import load_file, save_file

from memfit.cli import main
from memfit.data.build import split_indices
from memfit.data.phantoms import random_phantoms
from memfit.models.autoencoders import ConvAutoencoder
from memfit.monitor.metrics import read_metrics
from memfit.training.image_metrics import psnr

SIZE = 16
# A factory module written beside the weights, named by the config as 'file.py:function'.
FACTORY = f'''
from pathlib import Path
from safetensors.torch import load_file
from memfit.models.autoencoders import ConvAutoencoder

def architecture():
    return ConvAutoencoder(channels=1, size={SIZE}, widths=(8, 16), latent=32)

def pretrained():
    model = architecture()
    model.load_state_dict(load_file(Path(__file__).with_name("weights.safetensors")), strict=True)
    return model
'''


def pretrain(phantoms: np.ndarray, folder: Path) -> None:
    """A few plain Adam steps on the source contrast (the phantoms as they are)."""
    torch.manual_seed(0)
    model = ConvAutoencoder(channels=1, size=SIZE, widths=(8, 16), latent=32)
    images = torch.from_numpy(phantoms)[:, None]
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(40):
        batch = images[(torch.arange(16) + 16 * step) % len(images)]
        ((model(batch) - batch) ** 2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    save_file(model.state_dict(), folder / "weights.safetensors")
    (folder / "ae_model.py").write_text(FACTORY)


def test_lora_adapts_a_pretrained_autoencoder_to_a_new_contrast(tmp_path):
    phantoms = random_phantoms(64, SIZE, seed=0)
    np.save(tmp_path / "phantoms.npy", phantoms)
    pretrain(phantoms, tmp_path)
    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "adapt.yaml", {
        "model": {"factory": "ae_model.py:pretrained", "task": "autoencoder"},
        "data": {"path": "phantoms.npy", "format": "images", "eval_fraction": 0.25,
                 "images": {"size": SIZE, "contrast": ["invert", "gamma:0.7"]}},
        "adapter": {"kind": "lora", "rank": 4, "targets": ["encoder-late", "decoder"]},
        "precision": "bf16",
        "memory": {"gradient_checkpointing": True},
        "optimizer": {"lr": 5e-3},
        "train": {"micro_batch_size": 8, "gradient_accumulation_steps": 2, "max_steps": 20,
                  "output_dir": str(run_dir)},
        "log": {"progress": False, "tensorboard": False, "memory_every": 10},
    })
    result = run_in_process("train", str(config), cwd=tmp_path)
    assert result.returncode == 0, result.stderr

    evals = [record for record in read_metrics(run_dir) if "eval_loss" in record]
    assert [record["step"] for record in evals] == [0, 20]
    assert {"eval_psnr", "eval_ssim"} <= set(evals[0])
    assert evals[-1]["eval_psnr"] > evals[0]["eval_psnr"] + 1.0  # dB, on held-out images

    # `memfit merge` of a plain module: a state dict for the user's own class, strict.
    assert main(["merge", "--trust-code", str(run_dir), "--out", str(tmp_path / "merged")]) == 0
    namespace: dict = {"__file__": str(tmp_path / "ae_model.py")}
    exec(compile(FACTORY, "ae_model.py", "exec"), namespace)  # the user's own module
    model = namespace["architecture"]()
    model.load_state_dict(load_file(tmp_path / "merged" / "model.safetensors"), strict=True)
    adapted_psnr = psnr(model(inverted_eval_images(phantoms)), inverted_eval_images(phantoms))
    # bf16 training vs this fp32 forward: close to the run's own last evaluation.
    assert abs(adapted_psnr.mean().item() - evals[-1]["eval_psnr"]) < 0.5


def inverted_eval_images(phantoms: np.ndarray) -> torch.Tensor:
    """The run's eval split (25% of 64, seed 0) in the target contrast, (16, 1, 16, 16)."""
    _, held_out = split_indices(len(phantoms), 0.25, seed=0)
    return (1 - torch.from_numpy(phantoms[held_out])[:, None]) ** 0.7


def test_image_config_mistakes_are_one_line_errors(tmp_path, capsys):
    np.save(tmp_path / "phantoms.npy", random_phantoms(4, SIZE, seed=0))
    base = ["train", "model.preset=conv-autoencoder", "model.task=autoencoder",
            f"data.path={tmp_path / 'phantoms.npy'}", "data.format=images"]
    for extra, message in [
        (["data.format=text"], "model.task=autoencoder needs data.format=images, not text"),
        ([], "model.preset=conv-autoencoder needs data.images.size"),
        (["data.images.size=16", "data.images.contrast=[blur]"],
         "data.images.contrast: unknown contrast transform 'blur'"),
    ]:
        assert main([*base, *extra]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("memfit: error: ") and message in lines[0]
