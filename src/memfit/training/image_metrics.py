"""Image quality per image: PSNR and SSIM, batched in torch on the model's device.

Both take (B, C, H, W) intensities whose range is ``data_range`` (1 for memfit's [0, 1]
images) and return (B,): one value per image, to be averaged over images like the loss.
The prediction is clamped to [0, data_range] first, as it would be to view or save it;
that never increases the error. Computed in float32 with autocast off, whatever the
training precision, so bf16 runs report comparable numbers.

SSIM follows Wang et al. (2004): an 11-tap Gaussian window of sigma 1.5 (narrowed to the
largest odd size that fits smaller images), K1 = 0.01, K2 = 0.03, population
(co)variances, averaged over the valid window positions and the channels — the settings
of scikit-image's ``structural_similarity(gaussian_weights=True,
use_sample_covariance=False, sigma=1.5)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# PSNR of a perfect reconstruction would be infinite; an MSE floor caps it at 100 dB so
# means over images stay finite.
_MIN_MSE = 1e-10


def psnr(prediction: torch.Tensor, target: torch.Tensor, data_range: float = 1.0
         ) -> torch.Tensor:
    """10 log10(data_range^2 / MSE) per image, in dB: (B, C, H, W) x 2 -> (B,)."""
    with torch.autocast(prediction.device.type, enabled=False):
        prediction, target = _prepare(prediction, target, data_range)
        mse = (prediction - target).square().flatten(1).mean(1)
        return 10 * torch.log10(data_range**2 / mse.clamp(min=_MIN_MSE))


def ssim(prediction: torch.Tensor, target: torch.Tensor, data_range: float = 1.0,
         window_size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    """Mean structural similarity per image: (B, C, H, W) x 2 -> (B,), 1 when equal."""
    with torch.autocast(prediction.device.type, enabled=False):
        x, y = _prepare(prediction, target, data_range)
        size = min(window_size, *x.shape[-2:])
        size -= 1 - size % 2  # odd, so the window has a centre
        blur = _gaussian_filter(size, sigma, x.shape[1], x.device)

        # Local weighted means and (co)variances over every valid window position:
        # each (B, C, H - size + 1, W - size + 1).
        mean_x, mean_y = blur(x), blur(y)
        var_x = blur(x * x) - mean_x.square()
        var_y = blur(y * y) - mean_y.square()
        cov_xy = blur(x * y) - mean_x * mean_y
        c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
        similarity = ((2 * mean_x * mean_y + c1) * (2 * cov_xy + c2)
                      / ((mean_x.square() + mean_y.square() + c1) * (var_x + var_y + c2)))
        return similarity.flatten(1).mean(1)


def _prepare(prediction: torch.Tensor, target: torch.Tensor, data_range: float
             ) -> tuple[torch.Tensor, torch.Tensor]:
    if prediction.shape != target.shape or prediction.ndim != 4:
        raise ValueError(f"need two (B, C, H, W) tensors of one shape, got "
                         f"{tuple(prediction.shape)} and {tuple(target.shape)}")
    return prediction.float().clamp(0, data_range), target.float()


def _gaussian_filter(size: int, sigma: float, channels: int, device: torch.device):
    """A separable, normalised Gaussian blur without padding, per channel."""
    offsets = torch.arange(size, dtype=torch.float32, device=device) - (size - 1) / 2
    taps = torch.exp(-offsets.square() / (2 * sigma**2))
    taps = taps / taps.sum()
    rows = taps.view(1, 1, size, 1).expand(channels, 1, size, 1)  # (C, 1, size, 1)
    columns = taps.view(1, 1, 1, size).expand(channels, 1, 1, size)  # (C, 1, 1, size)

    def blur(image: torch.Tensor) -> torch.Tensor:
        return F.conv2d(F.conv2d(image, rows, groups=channels), columns, groups=channels)
    return blur
