"""Stochastic rounding: unbiased, and small updates to bf16 weights do not vanish."""

from __future__ import annotations

import torch

from memfit.optim import stochastic_round_to_bf16


def test_rounds_to_a_bf16_neighbour_and_is_unbiased() -> None:
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(64, generator=generator) * torch.logspace(-3, 3, 64)
    samples = 4000
    rounded = stochastic_round_to_bf16(
        values.repeat(samples, 1).contiguous(), generator
    ).float()  # samples x 64
    # Neighbours of x in bf16: truncation toward zero and the next value away from zero.
    truncated_bits = values.view(torch.int32) & -65536
    down = truncated_bits.view(torch.float32)
    up = (truncated_bits + 65536).view(torch.float32)  # next bf16 magnitude, same sign
    ulp = (up - down).abs()
    assert ((rounded == down) | (rounded == up)).all()
    # Mean of Bernoulli roundings: standard error <= ulp / (2 sqrt(samples)); allow 5 sigma.
    error = (rounded.mean(dim=0) - values).abs()
    assert (error <= 5 * ulp / (2 * samples**0.5)).all()


def test_exact_values_and_infinities_are_kept() -> None:
    exact = torch.tensor([0.0, 1.0, -2.5, float("inf"), -float("inf")])
    assert torch.equal(stochastic_round_to_bf16(exact).float(), exact)


def test_small_updates_survive_with_stochastic_rounding() -> None:
    """Least squares by gradient descent for 400 steps with updates far below a bf16 ulp:
    round-to-nearest freezes the weights, stochastic rounding tracks fp32."""
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(128, 16, generator=generator)
    target_weights = torch.randn(16, generator=generator)
    targets = inputs @ target_weights
    start = torch.full((16,), 4.0)  # bf16 ulp at 4.0 is 2**-5 = 0.03

    def gradient(weights: torch.Tensor) -> torch.Tensor:
        return 2 * inputs.T @ (inputs @ weights - targets) / len(inputs)

    learning_rate = 1e-3  # steps of about 1e-3 * |grad| ~ 5e-3 < half an ulp
    master = start.clone()
    nearest = start.to(torch.bfloat16)
    stochastic = start.to(torch.bfloat16)
    for _ in range(400):
        master -= learning_rate * gradient(master)
        nearest = (nearest.float() - learning_rate * gradient(nearest.float())).to(torch.bfloat16)
        stochastic = stochastic_round_to_bf16(
            stochastic.float() - learning_rate * gradient(stochastic.float()), generator
        )
    assert (master - start).norm() > 1.0  # fp32 moved substantially
    nearest_error = (nearest.float() - master).norm()
    stochastic_error = (stochastic.float() - master).norm()
    assert stochastic_error < 0.2 * nearest_error
