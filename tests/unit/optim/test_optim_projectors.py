"""Projection bases: randomized SVD vs SVD, the online-PCA step, the random basis."""

from __future__ import annotations

import torch

from memfit.optim.inner import adam_direction
from memfit.optim.projectors import (
    change_of_basis,
    online_pca_gradient,
    online_pca_loss,
    random_basis,
    randomized_svd_basis,
    svd_basis,
)


def _low_rank_plus_noise(rows: int, columns: int, rank: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    signal = torch.randn(rows, rank, generator=generator) @ torch.randn(
        rank, columns, generator=generator
    )
    return signal + 1e-2 * torch.randn(rows, columns, generator=generator)


def test_randomized_svd_spans_the_svd_subspace() -> None:
    matrix = _low_rank_plus_noise(60, 200, 6, seed=0)  # s x l, 6 strong directions
    exact = svd_basis(matrix, 6)
    approximate = randomized_svd_basis(matrix, 6, torch.Generator().manual_seed(1))
    assert approximate.shape == (60, 6)
    torch.testing.assert_close(approximate.T @ approximate, torch.eye(6), atol=1e-5, rtol=0)
    # ||P_svd^T P_rand||_F^2 / r = mean squared cosine of the principal angles.
    overlap = (exact.T @ approximate).pow(2).sum() / 6
    assert overlap > 0.999


def test_randomized_svd_is_reproducible_from_its_seed() -> None:
    matrix = _low_rank_plus_noise(30, 50, 4, seed=2)
    first = randomized_svd_basis(matrix, 4, torch.Generator().manual_seed(7))
    second = randomized_svd_basis(matrix, 4, torch.Generator().manual_seed(7))
    assert torch.equal(first, second)


def test_online_pca_gradient_matches_autograd() -> None:
    generator = torch.Generator().manual_seed(0)
    basis = torch.randn(8, 3, generator=generator, requires_grad=True)
    matrix = torch.randn(8, 20, generator=generator)
    online_pca_loss(basis, matrix, 0.1).backward()
    torch.testing.assert_close(online_pca_gradient(basis.detach(), matrix, 0.1), basis.grad)


def test_online_steps_reduce_pca_loss_and_stay_orthonormal() -> None:
    matrix = _low_rank_plus_noise(16, 40, 3, seed=3)
    start, _ = torch.linalg.qr(torch.randn(16, 3, generator=torch.Generator().manual_seed(4)))
    basis = start.clone()
    state: dict = {}
    for _ in range(300):
        direction = adam_direction(
            state, online_pca_gradient(basis, matrix, 0.1), (0.9, 0.999), 1e-8, prefix="p_"
        )
        basis = basis - 1e-2 * direction
    assert online_pca_loss(basis, matrix, 0.1) < 0.1 * online_pca_loss(start, matrix, 0.1)
    assert (basis.T @ basis - torch.eye(3)).norm() < 0.05


def test_random_basis_depends_only_on_seed() -> None:
    first = random_basis(10, 4, torch.Generator().manual_seed(3), torch.device("cpu"))
    again = random_basis(10, 4, torch.Generator().manual_seed(3), torch.device("cpu"))
    other = random_basis(10, 4, torch.Generator().manual_seed(4), torch.device("cpu"))
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_change_of_basis_maps_projected_coordinates() -> None:
    generator = torch.Generator().manual_seed(5)
    old = torch.randn(12, 4, generator=generator)  # not orthonormal (random projector)
    new = torch.randn(12, 4, generator=generator)
    matrix = old @ torch.randn(4, 9, generator=generator)  # lies in span(old)
    rotation = change_of_basis(new, old)
    torch.testing.assert_close(rotation @ (old.T @ matrix), new.T @ matrix, atol=1e-4, rtol=1e-4)


def test_align_signs_keeps_each_column_pointing_the_old_way() -> None:
    from memfit.optim.projectors import align_signs

    old = torch.linalg.qr(torch.randn(10, 3)).Q
    flipped = old * torch.tensor([1.0, -1.0, -1.0])
    torch.testing.assert_close(align_signs(flipped, old), old)
