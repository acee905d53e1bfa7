"""What a GaLore projector refresh costs, and what to do with the moments when P changes.

    python benchmarks/projector_refresh.py [--size 4096] [--rank 128] [--device cpu]
                                           [--skip-quality] [--skip-demo]

1. Time of one refresh at `rank` on a size x size gradient (low rank + noise): full SVD vs
   the seeded randomized SVD, the ratio (target: at least 10x), and how much of the SVD
   subspace the randomized one captures (||P_svd^T P_rand||_F^2 / rank, 1.0 = identical
   subspace).
2. subspace_change keep / reset / reproject: final training loss of GaLore (svd, rank 4,
   update_gap 10, 300 steps) on a tiny MLP regression, mean over 3 seeds. The lowest is
   GaLore's default. (The fine-tuning of benchmarks/quality.py ranks reproject first
   instead; see GALORE_SUBSPACE_CHANGE there.)
3. The refreshes of a real fine-tuning: quality.py's GaLore randomized_svd run (demo base,
   rank 32, update_gap 20, seed 0, lr 3e-4) with the gradient of every projected weight
   kept at each refresh: how close randomized SVD is to the exact SVD there, and how much
   the subspace and its coordinates move from one refresh to the next.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from memfit.optim import GaLore
from memfit.optim.projectors import randomized_svd_basis, svd_basis
from memfit.optim.stochastic_rounding import make_generator

SPEED_UP_TARGET = 10.0


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
    speed_up = svd_seconds / randomized_seconds
    print(f"  speed-up        {speed_up:8.1f} x")
    print(f"  subspace overlap {overlap:.4f}")
    verdict = "met" if speed_up >= SPEED_UP_TARGET else "MISSED"
    print(f"  randomized refresh vs full SVD: {speed_up:.1f}x ({verdict}: target at least "
          f"{SPEED_UP_TARGET:.0f}x)")


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


def _overlap(first: torch.Tensor, second: torch.Tensor) -> float:
    """||P_1^T P_2||_F^2 / r for orthonormal s x r bases: the mean squared cosine of their
    principal angles (1.0: the same subspace)."""
    return float((first.T @ second).pow(2).sum() / first.shape[1])


def _oriented(grad: torch.Tensor) -> torch.Tensor:
    """The gradient as GaLore projects it: a matrix with its smaller side first (s x l)."""
    matrix = grad.reshape(grad.shape[0], -1).float()
    return matrix.T if matrix.shape[0] > matrix.shape[1] else matrix


def _mean_of(rows: list[dict[str, float]], key: str) -> str:
    values = [row[key] for row in rows if key in row]  # the first refresh has no old P
    return f"{statistics.mean(values):.3f}" if values else "-"


def demo_refreshes(steps: int = 80, lr: float = 3e-4) -> None:
    from quality import _galore, base_config

    from memfit.config.load import merge
    from memfit.techniques.config_checks import from_mapping
    from memfit.training.batches import BatchStream
    from memfit.training.build import build_run

    with tempfile.TemporaryDirectory() as folder:
        raw = merge(merge(base_config(steps, 0, Path(folder)), _galore("randomized_svd")),
                    {"optimizer": {"lr": lr}})
        run = build_run(from_mapping(raw))
    optimizer, model = run.optimizer, run.model
    projected = [p for group in optimizer.param_groups for p in group["params"]
                 if optimizer.accumulation_shape(p) is not None]
    stream = BatchStream(run.splits.train, run.config.train.micro_batch_size,
                         run.config.train.seed, run.collate)
    rows: dict[int, list[dict[str, float]]] = {}
    model.train()
    for step in range(steps):
        batch = stream.next_batch()
        (run.objective.loss_sum(model, batch) / run.objective.count(batch)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), run.config.train.max_grad_norm)
        pending = [(p, _oriented(p.grad), optimizer.state[p].get("projector"))
                   for p in projected if optimizer.refresh_pending(p)]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        run.scheduler.step()
        for param, g, old in pending:
            new = optimizer.state[param]["projector"]  # s x r, randomized SVD of g
            exact = svd_basis(g, new.shape[1])
            row = {"svd_rsvd": _overlap(exact, new),
                   "energy_svd": float((exact.T @ g).norm() ** 2 / g.norm() ** 2),
                   "energy_rsvd": float((new.T @ g).norm() ** 2 / g.norm() ** 2)}
            if old is not None:
                cross = new.T @ old  # r x r
                row["old_new"] = _overlap(old, new)
                row["diagonal"] = float(cross.diagonal().abs().mean())
                row["best"] = float(torch.linalg.svdvals(cross).mean())
            rows.setdefault(step, []).append(row)
    print(f"\nrefreshes of GaLore randomized_svd fine-tuning the demo base (rank 32, "
          f"update_gap 20, lr {lr:.0e}, seed 0), mean over the {len(projected)} projected "
          f"weights:")
    print("  overlap: ||P_1^T P_2||_F^2 / r; energy: ||P^T g||^2 / ||g||^2; "
          "column match: mean |diag(P_new^T P_old)|;\n  best match: the mean cosine of "
          "the principal angles, what a rotation of P_new within its span could reach")
    print(f"  {'step':>4}  {'overlap svd/rsvd':>16} {'(min)':>6}  {'energy svd':>10} "
          f"{'rsvd':>6}  {'overlap old/new':>15}  {'column match':>12}  {'best match':>10}")
    for step, found in rows.items():
        means = {key: _mean_of(found, key) for key in
                 ("svd_rsvd", "energy_svd", "energy_rsvd", "old_new", "diagonal", "best")}
        lowest = min(row["svd_rsvd"] for row in found)
        print(f"  {step:4d}  {means['svd_rsvd']:>16} {lowest:6.3f}  {means['energy_svd']:>10} "
              f"{means['energy_rsvd']:>6}  {means['old_new']:>15}  {means['diagonal']:>12}  "
              f"{means['best']:>10}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--rank", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--skip-quality", action="store_true",
                        help="skip part 2 (subspace_change on the tiny MLP)")
    parser.add_argument("--skip-demo", action="store_true",
                        help="skip part 3 (refreshes of the demo fine-tuning)")
    args = parser.parse_args()
    refresh_cost(args.size, args.rank, torch.device(args.device))
    if not args.skip_quality:
        subspace_change_quality()
    if not args.skip_demo:
        demo_refreshes()


if __name__ == "__main__":
    main()
