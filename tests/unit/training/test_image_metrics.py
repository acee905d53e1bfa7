"""PSNR / SSIM against plain numpy references written from the definitions (Wang et al.
2004 for SSIM: Gaussian-weighted local statistics at every window position), and the
autoencoder objective's loss and evaluation sums."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from memfit.training.image_metrics import psnr, ssim
from memfit.training.objective import Objective


def reference_psnr(prediction: np.ndarray, target: np.ndarray) -> float:
    mse = np.mean((np.clip(prediction, 0, 1).astype(np.float64) - target) ** 2)
    return 10 * math.log10(1.0 / mse)


def reference_ssim(prediction: np.ndarray, target: np.ndarray, size: int = 11,
                   sigma: float = 1.5) -> float:
    """One (C, H, W) image pair, window by window, in float64."""
    x = np.clip(prediction, 0, 1).astype(np.float64)
    y = target.astype(np.float64)
    offsets = np.arange(size) - (size - 1) / 2
    taps = np.exp(-offsets**2 / (2 * sigma**2))
    weights = np.outer(taps, taps) / np.outer(taps, taps).sum()
    c1, c2 = 0.01**2, 0.03**2
    values = []
    for channel in range(x.shape[0]):
        for top in range(x.shape[1] - size + 1):
            for left in range(x.shape[2] - size + 1):
                a = x[channel, top:top + size, left:left + size]
                b = y[channel, top:top + size, left:left + size]
                mean_a, mean_b = (weights * a).sum(), (weights * b).sum()
                var_a = (weights * (a - mean_a) ** 2).sum()
                var_b = (weights * (b - mean_b) ** 2).sum()
                cov = (weights * (a - mean_a) * (b - mean_b)).sum()
                values.append((2 * mean_a * mean_b + c1) * (2 * cov + c2)
                              / ((mean_a**2 + mean_b**2 + c1) * (var_a + var_b + c2)))
    return float(np.mean(values))


@pytest.fixture
def pair() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    target = torch.rand(3, 2, 16, 16, generator=generator)
    # Out-of-range values in the prediction exercise the clamp.
    prediction = target + 0.2 * torch.randn(3, 2, 16, 16, generator=generator)
    return prediction, target


def test_psnr_matches_the_definition_per_image(pair):
    prediction, target = pair
    values = psnr(prediction, target)
    expected = [reference_psnr(p.numpy(), t.numpy())
                for p, t in zip(prediction, target, strict=True)]
    assert values.shape == (3,)
    torch.testing.assert_close(values, torch.tensor(expected, dtype=torch.float32))
    assert psnr(target, target).eq(100).all()  # capped, not infinite


def test_ssim_matches_the_windowed_definition(pair):
    prediction, target = pair
    values = ssim(prediction, target)
    expected = [reference_ssim(p.numpy(), t.numpy())
                for p, t in zip(prediction, target, strict=True)]
    torch.testing.assert_close(values, torch.tensor(expected, dtype=torch.float32),
                               atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ssim(target, target), torch.ones(3))


def test_ssim_narrows_the_window_for_small_images(pair):
    prediction, target = (t[:, :, :8, :7] for t in pair)  # fits a 7-tap window
    expected = [reference_ssim(p.numpy(), t.numpy(), size=7)
                for p, t in zip(prediction, target, strict=True)]
    torch.testing.assert_close(ssim(prediction, target),
                               torch.tensor(expected, dtype=torch.float32), atol=1e-5, rtol=1e-4)


def test_metrics_ignore_autocast(pair):
    prediction, target = pair
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_autocast = ssim(prediction, target), psnr(prediction, target)
    assert under_autocast[0].dtype == torch.float32
    torch.testing.assert_close(under_autocast[0], ssim(prediction, target))
    torch.testing.assert_close(under_autocast[1], psnr(prediction, target))


class Scale(torch.nn.Module):
    """forward(images) -> images * weight: a reconstruction with a known error."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor(0.5))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return images * self.weight


@pytest.mark.parametrize("kind, loss", [("mse", F.mse_loss), ("l1", F.l1_loss)])
def test_autoencoder_objective_sums_per_image_means(pair, kind, loss):
    _, target = pair
    images = target.flip(-1)
    objective = Objective(causal_lm=False, reconstruction_loss=kind)
    model = Scale()
    with_target = {"images": images, "targets": target}
    total = objective.loss_sum(model, with_target)
    torch.testing.assert_close(total, 3 * loss(images * 0.5, target))
    assert objective.count(with_target) == 3
    # Without "targets" the input itself is the target (plain reconstruction).
    torch.testing.assert_close(objective.loss_sum(model, {"images": images}),
                               3 * loss(images * 0.5, images))
    sums = objective.eval_sums(model, with_target)
    assert set(sums) == {"loss", "psnr", "ssim"}
    torch.testing.assert_close(sums["psnr"], psnr(images * 0.5, target).sum())
    torch.testing.assert_close(sums["ssim"], ssim(images * 0.5, target).sum())
