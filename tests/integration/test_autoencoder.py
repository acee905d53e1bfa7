"""The autoencoder-contrast example, short: a conv autoencoder pretrained on one contrast
is adapted through `memfit train` to another with LoRA (encoder-late + decoder), bf16,
gradient accumulation and activation checkpointing; PSNR on the target contrast improves,
and the merged result loads into the user's class with load_state_dict(strict=True)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from conftest import run_cli, write_config
from peft import PeftModel
from safetensors.torch import save_file

from memfit.data.phantoms import random_phantoms
from memfit.models.autoencoders import ConvAutoencoder
from memfit.monitor.metrics import read_metrics

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
    for step in range(60):
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
        "train": {"micro_batch_size": 8, "gradient_accumulation_steps": 2, "max_steps": 30,
                  "output_dir": str(run_dir)},
        "log": {"progress": False, "tensorboard": False, "memory_every": 15},
    })
    result = run_cli("train", str(config), cwd=tmp_path)
    assert result.returncode == 0, result.stderr

    evals = [record for record in read_metrics(run_dir) if "eval_loss" in record]
    assert [record["step"] for record in evals] == [0, 30]
    assert {"eval_psnr", "eval_ssim"} <= set(evals[0])
    assert evals[-1]["eval_psnr"] > evals[0]["eval_psnr"] + 1.0  # dB, on held-out images
    assert evals[-1]["eval_ssim"] > evals[0]["eval_ssim"]

    # What `memfit merge` hands over for a plain module: merged weights, strict load.
    namespace: dict = {"__file__": str(tmp_path / "ae_model.py")}
    exec(compile(FACTORY, "ae_model.py", "exec"), namespace)  # the user's own module
    merged = PeftModel.from_pretrained(namespace["pretrained"](), run_dir / "adapter")
    merged = merged.merge_and_unload()
    users_class = namespace["architecture"]()
    users_class.load_state_dict(merged.state_dict(), strict=True)
    images = torch.rand(2, 1, SIZE, SIZE)
    torch.testing.assert_close(users_class(images), merged(images))


def test_image_config_mistakes_are_one_line_errors(tmp_path):
    np.save(tmp_path / "phantoms.npy", random_phantoms(4, SIZE, seed=0))
    base = ["model.preset=conv-autoencoder", "model.task=autoencoder",
            f"data.path={tmp_path / 'phantoms.npy'}", "data.format=images"]
    for extra, message in [
        (["data.format=text"], "model.task=autoencoder needs data.format=images, not text"),
        ([], "model.preset=conv-autoencoder needs data.images.size"),
        (["data.images.size=16", "data.images.contrast=[blur]"],
         "data.images.contrast: unknown contrast transform 'blur'"),
    ]:
        result = run_cli("train", *base, *extra, cwd=tmp_path)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stderr
        assert lines[0].startswith("memfit: error: ") and message in lines[0]
