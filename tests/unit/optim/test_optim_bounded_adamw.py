"""BoundedAdamW against torch's AdamW, and the scratch bound the planner relies on."""

from __future__ import annotations

import pytest
import torch

from memfit.monitor.tensor_tracker import TensorTracker
from memfit.optim import BoundedAdamW
from memfit.optim.bounded_adamw import batches, step_scratch_bound

SHAPES = [(64, 32), (32,), (16, 64), (128, 8), (8,)]  # 8 KiB, 128 B, 4 KiB, 4 KiB, 32 B


def _parameters() -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in SHAPES]


def _groups(params: list[torch.nn.Parameter]) -> list[dict]:
    return [{"params": [p for p in params if p.dim() > 1], "weight_decay": 0.1},
            {"params": [p for p in params if p.dim() == 1], "weight_decay": 0.0}]


def _train(make) -> tuple[list[torch.Tensor], dict]:  # noqa: ANN001
    params = _parameters()
    optimizer = make(_groups(params))
    generator = torch.Generator().manual_seed(1)
    for step in range(3):
        for index, param in enumerate(params):
            # The last vector gets no gradient on the second step: it must be skipped.
            skip = step == 1 and index == len(params) - 1
            param.grad = None if skip else torch.randn(param.shape, generator=generator)
        optimizer.step()
    return [p.detach() for p in params], optimizer.state_dict()


def test_batched_steps_equal_torch_adamw_exactly() -> None:
    options = {"lr": 1e-2, "betas": (0.9, 0.99), "eps": 1e-8}
    expected, expected_state = _train(lambda g: torch.optim.AdamW(g, foreach=True, **options))
    # 4 KiB batches split the 8 KiB matrix, the two 4 KiB ones and the vectors apart.
    got, got_state = _train(lambda g: BoundedAdamW(g, batch_bytes=4096, **options))
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)
    assert got_state["param_groups"] == expected_state["param_groups"]
    for index, state in expected_state["state"].items():
        for key, value in state.items():
            assert torch.equal(got_state["state"][index][key], value), (index, key)


def test_batches_hold_at_most_the_limit_or_one_larger_tensor() -> None:
    assert batches([8192, 4096, 4096, 2048, 1024, 1024], limit=4096) == [
        [0], [1], [2], [3, 4, 5]]
    assert step_scratch_bound([[8192, 4096, 4096], [128, 32]], limit=4096) == 8192
    assert step_scratch_bound([[100, 200], [50]], limit=4096) == 300  # a whole small group


@pytest.mark.parametrize("batch_bytes", [4096, 1 << 30], ids=["bounded", "one batch"])
def test_step_scratch_is_the_largest_batch(batch_bytes: int) -> None:
    """torch's foreach step allocates sqrt(exp_avg_sq) for everything stepped together."""
    params = _parameters()
    module = torch.nn.ParameterList(params)
    optimizer = BoundedAdamW(_groups(params), batch_bytes=batch_bytes, lr=1e-2)
    tracker = TensorTracker()
    tracker.attach(module, optimizer)
    for _ in range(2):  # the second step: the state exists already
        for param in params:
            param.grad = torch.ones_like(param)
        tracker.scan()
        with tracker:
            tracker.reset_peak()
            optimizer.step()
    scratch = tracker.peak_by_category()["temporaries"]
    sizes = [[p.numel() * 4 for p in group["params"]] for group in _groups(params)]
    bound = step_scratch_bound(sizes, limit=batch_bytes)
    assert 8192 <= scratch <= bound  # at least sqrt(v) of the 64 x 32 matrix
    assert bound == (8192 if batch_bytes == 4096 else 16384)  # the matrices: 8 + 4 + 4 KiB
