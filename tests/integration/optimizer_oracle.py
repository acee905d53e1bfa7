"""What an optimizer's oracle test feeds it: seeded parameters and gradients of given shapes
(a vector without a gradient on the second step, which must stand still); the check of its
weights against a reference's, and the resume check, "save, load, continue =
uninterrupted", on them."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence

import torch

Shapes = Sequence[tuple[int, ...]]
MakeOptimizer = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]


def parameters(shapes: Shapes) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in shapes]


def gradients(shapes: Shapes, step: int) -> list[torch.Tensor | None]:
    """Step ``step``'s gradients; on step 1 the vectors (1-D shapes) get none."""
    generator = torch.Generator().manual_seed(100 + step)
    grads = [torch.randn(shape, generator=generator) for shape in shapes]
    return [None if step == 1 and len(shape) == 1 else grad
            for shape, grad in zip(shapes, grads, strict=True)]


def run(shapes: Shapes, params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer,
        steps: range) -> None:
    for step in steps:
        for param, grad in zip(params, gradients(shapes, step), strict=True):
            param.grad = grad
        optimizer.step()


def assert_steps_give(shapes: Shapes, make: MakeOptimizer, steps: int,
                      expected: list[torch.Tensor], **tolerance: float) -> None:
    """``steps`` steps of the optimizer leave the weights ``expected`` (the reference's)."""
    params = parameters(shapes)
    run(shapes, params, make(params), range(steps))
    for got, want in zip(params, expected, strict=True):
        torch.testing.assert_close(got.detach(), want, **tolerance)


def assert_resume_equals_uninterrupted(shapes: Shapes, make: MakeOptimizer) -> None:
    """5 steps straight against 2 steps, the state saved and loaded into a new optimizer
    over copies of the weights, and 3 more: bitwise the same weights."""
    straight = parameters(shapes)
    run(shapes, straight, make(straight), range(5))
    first = parameters(shapes)
    optimizer = make(first)
    run(shapes, first, optimizer, range(2))
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    resumed = [torch.nn.Parameter(p.detach().clone()) for p in first]
    again = make(resumed)
    again.load_state_dict(torch.load(buffer, weights_only=True))
    run(shapes, resumed, again, range(2, 5))
    for got, expected in zip(resumed, straight, strict=True):
        assert torch.equal(got, expected)
