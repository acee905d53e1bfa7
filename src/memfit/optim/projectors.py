"""Projection bases for GaLore-style optimizers.

Every function works on an *oriented* gradient g of shape s x l with s <= l (the caller
transposes tall matrices) and returns a basis P of shape s x r; the projected gradient is
R = P^T g (r x l) and a direction N in that space maps back as P @ N (s x l); APOLLO's
projectors (random, apollo_mini) instead scale g itself (apollo_scaled_gradient).
"""

from __future__ import annotations

from typing import Any, Literal

import torch

ProjectorName = Literal["svd", "randomized_svd", "online", "random", "apollo_mini"]
PROJECTOR_CHOICES: tuple[str, ...] = ("svd", "randomized_svd", "online", "random", "apollo_mini")

# Randomized range finder (Halko, Martinsson & Tropp 2011, Alg. 4.4): a few extra sketch
# columns and two power iterations give near-SVD subspaces for gradient spectra.
_OVERSAMPLE = 8
_POWER_ITERATIONS = 2

# APOLLO's norm-growth limiter: ||update_t|| <= 1.01 ||update_{t-1}||.
_NORM_GROWTH_LIMIT = 1.01


def svd_basis(g: torch.Tensor, rank: int) -> torch.Tensor:
    """Top-`rank` left singular vectors of g (s x l) -> s x rank."""
    u, _, _ = torch.linalg.svd(g, full_matrices=False)
    return u[:, :rank].contiguous()


def randomized_svd_basis(g: torch.Tensor, rank: int, generator: torch.Generator) -> torch.Tensor:
    """Approximate top-`rank` left singular vectors of g (s x l) -> s x rank.

    Cost O(s * l * (rank + oversample)) per pass instead of a full SVD's O(s^2 * l).
    """
    sketch_size = min(rank + _OVERSAMPLE, g.shape[0])
    omega = torch.randn(g.shape[1], sketch_size, generator=generator, device=g.device)
    basis = torch.linalg.qr(g @ omega).Q  # s x k, spans the dominant column space
    for _ in range(_POWER_ITERATIONS):
        # Re-orthonormalise between multiplications so small singular directions survive.
        basis = torch.linalg.qr(g @ torch.linalg.qr(g.T @ basis).Q).Q
    small_u, _, _ = torch.linalg.svd(basis.T @ g, full_matrices=False)  # (k x l) SVD: cheap
    return (basis @ small_u[:, :rank]).contiguous()


def align_signs(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """Flip columns of `new` (s x r) to point the same way as those of `old` (s x r).

    Singular vectors are defined only up to sign, and which sign an SVD returns depends on
    rounding noise. Moments kept across a refresh live in the old coordinates, so a flipped
    column would turn their accumulated direction around; aligning makes the refresh
    continuous (and two runs that differ only by rounding stay together).
    """
    signs = torch.where((new * old).sum(dim=0) < 0, -1.0, 1.0).to(new.dtype)
    return new * signs


def random_basis(
    rows: int, rank: int, generator: torch.Generator, device: torch.device
) -> torch.Tensor:
    """Gaussian basis with N(0, 1/rank) entries (APOLLO): E[R^T R] = g^T g, so column norms of
    R estimate those of g."""
    return torch.randn(rows, rank, generator=generator, device=device) / rank**0.5


def change_of_basis(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """C (r x r) with P_new^T g ~= C @ (P_old^T g) for g in the span of P_old.

    Least squares: g ~= P_old (P_old^T P_old)^-1 R_old, so C = P_new^T P_old (P_old^T P_old)^-1;
    for an orthonormal P_old this is P_new^T P_old.
    """
    gram = old.T @ old
    return torch.linalg.solve(gram, old.T @ new).T


def online_pca_gradient(basis: torch.Tensor, g: torch.Tensor, orthogonality: float) -> torch.Tensor:
    """Gradient in P of L(P) = ||P P^T G - G||_F^2 + lambda ||P^T P - I||_F^2, G = g / ||g||_F.

    Online Subspace Descent (Liang et al. 2024). With E = P P^T G - G (s x l):
    dL/dP = 2 (E G^T P + G E^T P) + 4 lambda P (P^T P - I), evaluated right to left so
    nothing s x s is formed.
    """
    normalised = g / g.norm().clamp_min(torch.finfo(g.dtype).tiny)
    residual = basis @ (basis.T @ normalised) - normalised
    gram_error = basis.T @ basis - torch.eye(basis.shape[1], device=g.device, dtype=g.dtype)
    return (
        2 * (residual @ (normalised.T @ basis) + normalised @ (residual.T @ basis))
        + 4 * orthogonality * basis @ gram_error
    )


def online_pca_loss(basis: torch.Tensor, g: torch.Tensor, orthogonality: float) -> torch.Tensor:
    """L(P) of online_pca_gradient (for monitoring and tests)."""
    normalised = g / g.norm()
    eye = torch.eye(basis.shape[1], device=g.device, dtype=g.dtype)
    reconstruction = (basis @ (basis.T @ normalised) - normalised).pow(2).sum()
    return reconstruction + orthogonality * (basis.T @ basis - eye).pow(2).sum()


def apollo_scaled_gradient(
    state: dict[str, Any],
    g: torch.Tensor,
    projected: torch.Tensor,
    direction: torch.Tensor,
    eps: float,
    tensor_wise: bool,
) -> torch.Tensor:
    """Raw gradient g (s x l) scaled per column by ||direction_j|| / ||R_j|| (APOLLO) or
    as a whole by ||direction|| / ||R|| (APOLLO-Mini), then limited to grow at most
    1.01x in norm per step (norm kept as a 0-d tensor: no host sync)."""
    if tensor_wise:
        scale = direction.norm() / (projected.norm() + eps)  # 0-d
    else:
        scale = direction.norm(dim=0) / (projected.norm(dim=0) + eps)  # (l,)
    update = g * scale
    norm = update.norm()
    if "update_norm" in state:
        limit = _NORM_GROWTH_LIMIT * state["update_norm"]
        factor = torch.clamp(limit / norm.clamp_min(torch.finfo(norm.dtype).tiny), max=1.0)
        update = update * factor
        norm = norm * factor
    state["update_norm"] = norm
    return update
