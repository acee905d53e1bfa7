"""What a GaLore projector refresh costs, and what to do with the moments when P changes.

    python benchmarks/projector_refresh.py [--size 4096] [--rank 128] [--device cpu]

1. Time of one refresh at `rank` on a size x size gradient (low rank + noise): full SVD vs
   the seeded randomized SVD, the ratio, and how much of the SVD subspace the randomized
   one captures (||P_svd^T P_rand||_F^2 / rank, 1.0 = identical subspace).
2. subspace_change keep / reset / reproject: final training loss of GaLore (svd, rank 4,
   update_gap 10, 300 steps) on a tiny MLP regression, mean over 3 seeds. The lowest is
   GaLore's default.
"""

from __future__ import annotations

import argparse
import time

import torch

from memfit.optim import GaLore
from memfit.optim.projectors import randomized_svd_basis, svd_basis
from memfit.optim.stochastic_rounding import make_generator


def _best_time(function, repeats: int, device: torch.device) -> float:
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        function()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def refresh_cost(size: int, rank: int, device: torch.device) -> None:
    generator = torch.Generator(device=device).manual_seed(0)
    # A gradient-like matrix: decaying spectrum of rank 4*rank plus small dense noise.
    left = torch.randn(size, 4 * rank, generator=generator, device=device)
    right = torch.randn(4 * rank, size, generator=generator, device=device)
    decay = torch.logspace(0, -3, 4 * rank, device=device).unsqueeze(1)
    gradient = left @ (decay * right) + 1e-3 * torch.randn(
        size, size, generator=generator, device=device
    )
    svd_basis(gradient[:256, :256], 8)  # warm up the linear-algebra backends
    randomized_svd_basis(gradient[:256, :256], 8, make_generator(0, device))
    exact = svd_basis(gradient, rank)
    approximate = randomized_svd_basis(gradient, rank, make_generator(1, device))
    svd_seconds = _best_time(lambda: svd_basis(gradient, rank), 2, device)
    randomized_seconds = _best_time(
        lambda: randomized_svd_basis(gradient, rank, make_generator(1, device)), 5, device
    )
    overlap = float((exact.T @ approximate).pow(2).sum() / rank)
    print(f"refresh of a {size}x{size} gradient at rank {rank} on {device}:")
    print(f"  full SVD        {svd_seconds:8.3f} s")
    print(f"  randomized SVD  {randomized_seconds:8.3f} s")
    print(f"  speed-up        {svd_seconds / randomized_seconds:8.1f} x")
    print(f"  subspace overlap {overlap:.4f}")


def _final_loss(subspace_change: str, seed: int, steps: int = 300) -> float:
    torch.manual_seed(seed)
    teacher = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 32))
    student = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 32))
    optimizer = GaLore(
        student.parameters(),
        lr=1e-2,
        rank=4,
        update_gap=10,
        scale=1.0,
        subspace_change=subspace_change,
        seed=seed,
    )
    losses = []
    for _ in range(steps):
        inputs = torch.randn(32, 32)
        with torch.no_grad():
            targets = teacher(inputs)
        loss = torch.nn.functional.mse_loss(student(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return sum(losses[-30:]) / 30  # mean of the last 30 steps: less batch noise


def subspace_change_quality(seeds: int = 3) -> None:
    print("subspace_change, final loss (mean of last 30 steps, mean over seeds):")
    for choice in ("keep", "reset", "reproject"):
        losses = [_final_loss(choice, seed) for seed in range(seeds)]
        print(
            f"  {choice:10s} {sum(losses) / seeds:.4f}   per seed {[round(x, 4) for x in losses]}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--rank", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--skip-quality", action="store_true")
    args = parser.parse_args()
    refresh_cost(args.size, args.rank, torch.device(args.device))
    if not args.skip_quality:
        subspace_change_quality()


if __name__ == "__main__":
    main()
