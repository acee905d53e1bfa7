"""GaLore against hand-written projected-update oracles, resume equality, bad arguments."""

from __future__ import annotations

import io

import pytest
import torch

from memfit._utils.errors import ConfigError
from memfit.optim import INNER_CHOICES, GaLore

BETAS = (0.9, 0.999)
EPS = 1e-8


def _batches(
    steps: int, features: int, outputs: int, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(16, features, generator=generator),
            torch.randn(16, outputs, generator=generator),
        )
        for _ in range(steps)
    ]


def _loss(weight: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return ((inputs @ weight.T - targets) ** 2).mean()


@pytest.mark.parametrize("features,outputs", [(10, 6), (6, 10)], ids=["wide", "tall"])
def test_svd_projected_adam_within_one_period(features: int, outputs: int) -> None:
    """Weight (outputs x features): wide -> P on the left (R = P^T G), tall -> on the right."""
    torch.manual_seed(0)
    rank, lr, scale, weight_decay = 2, 1e-2, 0.5, 0.1
    weight = torch.nn.Parameter(torch.randn(outputs, features))
    optimizer = GaLore(
        [weight], lr=lr, rank=rank, update_gap=100, scale=scale, weight_decay=weight_decay
    )
    oracle = weight.detach().clone()
    first_moment = second_moment = basis = None
    for step, (inputs, targets) in enumerate(_batches(5, features, outputs), start=1):
        optimizer.zero_grad()
        _loss(weight, inputs, targets).backward()
        optimizer.step()

        oracle_weight = oracle.clone().requires_grad_()
        _loss(oracle_weight, inputs, targets).backward()
        grad = oracle_weight.grad
        left = outputs <= features
        if basis is None:  # first step: SVD of the gradient, smaller side
            u, _, vh = torch.linalg.svd(grad, full_matrices=False)
            basis = u[:, :rank] if left else vh[:rank].T
            first_moment = torch.zeros(rank, features) if left else torch.zeros(outputs, rank)
            second_moment = torch.zeros_like(first_moment)
        projected = basis.T @ grad if left else grad @ basis
        first_moment = 0.9 * first_moment + 0.1 * projected
        second_moment = 0.999 * second_moment + 0.001 * projected**2
        adam = (first_moment / (1 - 0.9**step)) / ((second_moment / (1 - 0.999**step)).sqrt() + EPS)
        back = basis @ adam if left else adam @ basis.T
        oracle = oracle * (1 - lr * weight_decay) - lr * scale * back
        torch.testing.assert_close(weight.detach(), oracle, rtol=1e-5, atol=1e-6)


def test_unprojected_params_get_plain_adamw() -> None:
    generator = torch.Generator().manual_seed(0)
    ours = torch.nn.Parameter(torch.randn(8, generator=generator))
    small = torch.nn.Parameter(torch.randn(3, 8, generator=generator))  # min side 3 <= rank
    reference = [torch.nn.Parameter(p.detach().clone()) for p in (ours, small)]
    optimizer = GaLore([ours, small], lr=1e-2, rank=4, weight_decay=0.1)
    torch_adamw = torch.optim.AdamW(reference, lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        grads = [torch.randn(8, generator=generator), torch.randn(3, 8, generator=generator)]
        for params, opt in (([ours, small], optimizer), (reference, torch_adamw)):
            for param, grad in zip(params, grads, strict=True):
                param.grad = grad.clone()
            opt.step()
    torch.testing.assert_close(ours, reference[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(small, reference[1], rtol=1e-5, atol=1e-6)
    assert "projector_step" not in optimizer.state[small]


def test_conv_weight_is_projected_as_out_by_in_kernel() -> None:
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(4, 8, 3)  # weight 8 x 4 x 3 x 3 -> 8 x 36, projected on the left
    optimizer = GaLore(conv.parameters(), lr=1e-2, rank=2)
    before = conv.weight.detach().clone()
    conv(torch.randn(2, 4, 5, 5)).square().mean().backward()
    optimizer.step()
    state = optimizer.state[conv.weight]
    assert state["projector"].shape == (8, 2) and state["exp_avg"].shape == (2, 36)
    # The update lies in span(P) column-wise: (I - P P^T) dW = 0.
    change = (conv.weight.detach() - before).reshape(8, 36)
    basis = state["projector"]
    torch.testing.assert_close(
        change - basis @ (basis.T @ change), torch.zeros(8, 36), atol=1e-7, rtol=0
    )


def _apollo_against_oracle(projector: str, rank: int, scale: float, seed: int) -> GaLore:
    """Steps GaLore and a hand-written APOLLO side by side (one projection period): P is
    Gaussian N(0, 1/r) from the stored seed, Adam on R = P^T G, and the weight moves by the
    raw gradient scaled per column (APOLLO) or as a whole (APOLLO-Mini, rank 1) by
    ||Adam(R)|| / ||R||, its norm growing at most 1.01x per step."""
    torch.manual_seed(0)
    lr = 1e-2
    weight = torch.nn.Parameter(torch.randn(6, 10))
    optimizer = GaLore([weight], lr=lr, rank=rank, update_gap=100, scale=scale,
                       projector=projector, seed=seed)
    used_rank = 1 if projector == "apollo_mini" else rank
    oracle = weight.detach().clone()
    first_moment, second_moment = torch.zeros(used_rank, 10), torch.zeros(used_rank, 10)
    previous_norm = None
    for step, (inputs, targets) in enumerate(_batches(4, 10, 6), start=1):
        optimizer.zero_grad()
        _loss(weight, inputs, targets).backward()
        optimizer.step()

        state = optimizer.state[weight]
        generator = torch.Generator().manual_seed(state["projector_seed"])
        basis = torch.randn(6, used_rank, generator=generator) / used_rank**0.5
        oracle_weight = oracle.clone().requires_grad_()
        _loss(oracle_weight, inputs, targets).backward()
        grad = oracle_weight.grad
        projected = basis.T @ grad
        first_moment = 0.9 * first_moment + 0.1 * projected
        second_moment = 0.999 * second_moment + 0.001 * projected**2
        adam = (first_moment / (1 - 0.9**step)) / ((second_moment / (1 - 0.999**step)).sqrt() + EPS)
        if projector == "apollo_mini":  # one scale for the tensor
            update = grad * (adam.norm() / (projected.norm() + EPS))
        else:  # per column
            update = grad * (adam.norm(dim=0) / (projected.norm(dim=0) + EPS))
        if previous_norm is not None and update.norm() > 1.01 * previous_norm:
            update = update * (1.01 * previous_norm / update.norm())
        previous_norm = update.norm()
        oracle = oracle - lr * scale * update
        torch.testing.assert_close(weight.detach(), oracle, rtol=1e-5, atol=1e-6)
    return optimizer


def test_random_projector_is_apollo_and_stores_only_a_seed() -> None:
    rank = 3
    optimizer = _apollo_against_oracle("random", rank=rank, scale=1.0, seed=5)
    (state,) = optimizer.state.values()
    assert not any(isinstance(v, torch.Tensor) and v.shape == (6, rank) for v in state.values())

    same_seed = torch.nn.Parameter(torch.zeros(6, 10))
    other = GaLore([same_seed], rank=rank, projector="random", seed=5)
    same_seed.grad = torch.ones(6, 10)
    other.step()
    first_seed = optimizer.state_dict()["state"][0]["projector_seed"]
    assert isinstance(first_seed, int) and other.state[same_seed]["projector_seed"] == first_seed


def test_apollo_mini_is_rank_one_with_one_scale_per_tensor() -> None:
    """APOLLO-Mini (Zhu et al. 2025): rank 1 whatever `rank` says, the paper's scale."""
    optimizer = _apollo_against_oracle("apollo_mini", rank=4, scale=128**0.5, seed=7)
    (state,) = optimizer.state.values()
    assert {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)} == {
        "exp_avg": (1, 10), "exp_avg_sq": (1, 10), "update_norm": ()}
    assert GaLore.state_bytes((6, 10), optimizer.param_groups[0]) == 4 * (10 + 10 + 1)


def test_online_projector_keeps_its_adam_moments_and_stays_orthonormal() -> None:
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(6, 10))
    optimizer = GaLore([weight], lr=1e-2, rank=2, projector="online")
    for inputs, targets in _batches(20, 10, 6):
        optimizer.zero_grad()
        _loss(weight, inputs, targets).backward()
        optimizer.step()
    state = optimizer.state[weight]
    assert state["projector_exp_avg"].shape == (6, 2) and state["projector_inner_step"] == 19
    basis = state["projector"]
    assert (basis.T @ basis - torch.eye(2)).norm() < 0.05


@pytest.mark.parametrize("change", ["reset", "reproject"])
def test_subspace_change_policies(change: str) -> None:
    weight = torch.nn.Parameter(torch.zeros(4, 6))
    optimizer = GaLore([weight], rank=2, update_gap=2, subspace_change=change)
    grads = [torch.diag(torch.tensor([3.0, 2.0, 1.0, 0.5])) @ torch.ones(4, 6)] * 2
    grads.append(torch.randn(4, 6, generator=torch.Generator().manual_seed(0)))
    for grad in grads:
        weight.grad = grad
        old_basis = optimizer.state[weight].get("projector")
        old_moment = optimizer.state[weight].get("exp_avg")
        old_moment = None if old_moment is None else old_moment.clone()
        old_second = optimizer.state[weight].get("exp_avg_sq")
        old_second = None if old_second is None else old_second.clone()
        optimizer.step()
    state = optimizer.state[weight]
    if change == "reset":  # moments restarted at the third step's refresh
        assert state["inner_step"] == 1
        torch.testing.assert_close(state["exp_avg"], 0.1 * state["projector"].T @ grads[2])
    else:
        rotation = state["projector"].T @ old_basis
        expected = 0.9 * rotation @ old_moment + 0.1 * state["projector"].T @ grads[2]
        assert state["inner_step"] == 3
        torch.testing.assert_close(state["exp_avg"], expected, rtol=1e-4, atol=1e-5)
        # Second moment: C**2 v, plus the mean old v for the share of each new direction
        # outside the old subspace (here the new subspace is mostly new: a random gradient).
        squared = rotation**2
        unseen = (1 - squared.sum(dim=1)).clamp(min=0)
        assert unseen.max() > 0.1
        carried = squared @ old_second + unseen[:, None] * old_second.mean(dim=0)
        projected = state["projector"].T @ grads[2]
        torch.testing.assert_close(state["exp_avg_sq"], 0.999 * carried + 0.001 * projected**2,
                                   rtol=1e-4, atol=1e-6)


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: list) -> None:
    for inputs, targets in batches:
        optimizer.zero_grad()
        loss = ((model(inputs.to(model[0].weight.dtype)).float() - targets) ** 2).mean()
        loss.backward()
        optimizer.step()


def _tiny_model(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.Tanh(), torch.nn.Linear(12, 6)).to(
        dtype
    )


@pytest.mark.parametrize("projector", ["svd", "randomized_svd", "online", "random"])
@pytest.mark.parametrize("inner", INNER_CHOICES)
def test_resume_equals_uninterrupted(projector: str, inner: str) -> None:
    dtype = torch.bfloat16 if inner == "adamw" else torch.float32  # bf16 exercises rounding
    options = dict(
        lr=1e-2, rank=3, update_gap=2, projector=projector, inner=inner, subspace_change="reproject"
    )
    if projector == "online":
        options["subspace_change"] = "keep"
    batches = _batches(6, 8, 6, seed=1)
    model = _tiny_model(dtype)
    optimizer = GaLore(model.parameters(), **options)
    _train(model, optimizer, batches[:3])

    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed_model = _tiny_model(dtype)
    resumed_model.load_state_dict(saved["model"])
    resumed = GaLore(resumed_model.parameters(), **options)
    resumed.load_state_dict(saved["optimizer"])

    _train(model, optimizer, batches[3:])
    _train(resumed_model, resumed, batches[3:])
    for original, restored in zip(model.parameters(), resumed_model.parameters(), strict=True):
        assert torch.equal(original, restored)


@pytest.mark.parametrize(
    "options,message",
    [
        ({"projector": "pca"}, "svd, randomized_svd, online, random"),
        ({"inner": "sgd"}, "adamw, adamw8bit, adafactor"),
        ({"subspace_change": "drop"}, "keep, reset, reproject"),
        ({"projector": "online", "subspace_change": "reset"}, "keep, reproject"),
        ({"rank": 0}, "rank=0"),
    ],
)
def test_bad_arguments_raise_config_error(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        GaLore([torch.nn.Parameter(torch.zeros(4, 4))], **options)
    with pytest.raises(ConfigError, match=message):  # also per parameter group
        GaLore([{"params": [torch.nn.Parameter(torch.zeros(4, 4))], **options}])
