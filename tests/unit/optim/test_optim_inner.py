"""Block-wise 8-bit quantisation, the inner rules, and memfit's AdamW against plain oracles."""

from __future__ import annotations

import io

import pytest
import torch

from memfit.optim import AdamW
from memfit.optim.inner import adafactor_direction, adam_direction
from memfit.optim.quantize import BLOCK_SIZE, dequantize_blockwise, quantize_blockwise


@pytest.mark.parametrize("signed", [True, False])
def test_quantize_roundtrip_relative_error(signed: bool) -> None:
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(3, 300, generator=generator) * torch.logspace(-4, 0, 300)
    if not signed:
        values = values.square()
    codes, absmax = quantize_blockwise(values, signed)
    assert codes.dtype == torch.uint8 and codes.numel() == 4 * BLOCK_SIZE  # 900 padded
    assert absmax.shape == (4,)
    restored = dequantize_blockwise(codes, absmax, values.shape, signed)
    # Log-spaced code: neighbouring entries differ by <= 14%, so rounding error <= 7%.
    tolerance = 0.07 * values.abs() + 1e-6 * absmax.max()
    assert ((restored - values).abs() <= tolerance).all()


def test_quantize_zero_block_is_exact() -> None:
    codes, absmax = quantize_blockwise(torch.zeros(10), signed=True)
    assert torch.equal(dequantize_blockwise(codes, absmax, torch.Size([10]), True), torch.zeros(10))


def test_adam_direction_8bit_tracks_fp32() -> None:
    generator = torch.Generator().manual_seed(0)
    state_fp32: dict = {}
    state_8bit: dict = {}
    for _ in range(30):
        grad = torch.randn(8, 40, generator=generator)
        exact = adam_direction(state_fp32, grad, (0.9, 0.999), 1e-8)
        approximate = adam_direction(state_8bit, grad, (0.9, 0.999), 1e-8, eight_bit=True)
        # Directions are O(1). The log code rounds each stored value by <= 7% (~4% rms) and
        # the moments are requantised every step, so errors accumulate through the EMA.
        assert (approximate - exact).abs().max() < 0.15
        assert (approximate - exact).norm() < 0.1 * exact.norm()
    assert state_8bit["exp_avg_codes"].dtype == torch.uint8
    assert "exp_avg" not in state_8bit


def test_adafactor_direction_matches_plain_formula() -> None:
    generator = torch.Generator().manual_seed(0)
    state: dict = {}
    row = torch.zeros(4)
    col = torch.zeros(6)
    eps = 1e-8
    for step in range(1, 6):
        grad = torch.randn(4, 6, generator=generator)
        beta2 = 1 - step**-0.8
        row = beta2 * row + (1 - beta2) * (grad**2).mean(dim=1)
        col = beta2 * col + (1 - beta2) * (grad**2).mean(dim=0)
        second_moment = row[:, None] * col[None, :] / row.mean()
        expected = grad / (second_moment.sqrt() + eps)
        expected = expected / max(1.0, float(expected.pow(2).mean().sqrt()))
        got = adafactor_direction(state, grad, eps)
        torch.testing.assert_close(got, expected)
    assert set(state) == {"inner_step", "exp_avg_sq_row", "exp_avg_sq_col"}


def _regression_steps(optimizer: torch.optim.Optimizer, model: torch.nn.Module, steps: int) -> None:
    generator = torch.Generator().manual_seed(42)
    for _ in range(steps):
        inputs = torch.randn(8, 6, generator=generator)
        targets = torch.randn(8, 3, generator=generator)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs.to(model.weight.dtype)).float(), targets)
        loss.backward()
        optimizer.step()


def test_adamw_matches_torch_adamw_in_fp32() -> None:
    torch.manual_seed(0)
    ours = torch.nn.Linear(6, 3)
    reference = torch.nn.Linear(6, 3)
    reference.load_state_dict(ours.state_dict())
    _regression_steps(AdamW(ours.parameters(), lr=1e-2, weight_decay=0.1), ours, 10)
    _regression_steps(
        torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1), reference, 10
    )
    torch.testing.assert_close(ours.weight, reference.weight, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.bias, reference.bias, rtol=1e-5, atol=1e-6)


def test_adamw_bf16_tracks_fp32_and_resumes_exactly() -> None:
    torch.manual_seed(0)
    master = torch.nn.Linear(6, 3)
    pure = torch.nn.Linear(6, 3).to(torch.bfloat16)
    pure.load_state_dict(master.state_dict())
    _regression_steps(AdamW(master.parameters(), lr=1e-3), master, 20)
    optimizer = AdamW(pure.parameters(), lr=1e-3)
    _regression_steps(optimizer, pure, 20)
    # Each of 20 steps moves a weight by ~1e-3; bf16 rounding noise stays below a few ulps.
    assert (pure.weight.float() - master.weight).abs().max() < 2e-2
    assert optimizer.state[pure.weight]["exp_avg"].dtype == torch.float32

    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    copy = torch.nn.Linear(6, 3).to(torch.bfloat16)
    copy.load_state_dict(pure.state_dict())
    resumed = AdamW(copy.parameters(), lr=1e-3)
    buffer.seek(0)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert resumed.state[copy.weight]["exp_avg"].dtype == torch.float32  # not cast to bf16
    _regression_steps(optimizer, pure, 5)
    _regression_steps(resumed, copy, 5)
    assert torch.equal(pure.weight, copy.weight)
