"""GaLore family: Adam-type updates on a low-rank projection of each weight's gradient.

For a weight viewed as a matrix (conv weights as out x in*kh*kw) with gradient G, the
smaller side s of G is projected: g is G (s x l) or G^T when G is tall, P is s x r,
R = P^T g is r x l, the inner rule (AdamW, 8-bit AdamW or Adafactor) keeps its moments on R,
and the weight moves by lr * scale * P @ inner(R) (mapped back to G's layout), after
decoupled weight decay W *= 1 - lr * weight_decay.

Projectors (Zhao et al. 2024; Liang et al. 2024; Zhu et al. 2025):
  svd             top-r left singular vectors of g, recomputed every update_gap steps
  randomized_svd  the same subspace from a seeded randomized range finder (much cheaper)
  online          one SVD, then one Adam step per iteration on the online-PCA loss
                  (step online_lr_ratio * lr, orthogonality weight online_orthogonality);
                  P's Adam moments live in the state; update_gap is not used
  random          APOLLO: seeded Gaussian P regenerated every update_gap steps (only the
                  seed is stored); the weight moves by the raw gradient scaled per channel
                  (columns of g) by ||inner(R)|| / ||R||, with norm-growth limiter 1.01
  apollo_mini     APOLLO-Mini: the same with rank 1 whatever `rank` says, and one scale for
                  the whole tensor, ||inner(R)|| / ||R||: the state is a 1 x l moment pair
                  (Zhu et al. 2025 pair it with scale = sqrt(128))

subspace_change, what the moments do when P changes: "keep" them as they are (they then
describe coordinates of the new subspace), "reset" them to zero (restarting bias
correction), or "reproject" them (default): m <- C m, v <- C**2 v with C = P_new^T P_old,
plus, for the share of each new direction outside the old subspace, the old v's mean
(memfit.optim.inner.rotate_moments). A refresh replaces about half of the subspace and the
new singular vectors do not line up with the old ones column by column, so "keep" hands
new directions the moments of unrelated old ones. Measured (mean over 3 seeds):
`python benchmarks/projector_refresh.py` tiny MLP regression (svd rank 4, update_gap 10,
mean of the last 30 losses) keep 0.0040, reset 0.0043, reproject 0.0036; demo fine-tuning
(benchmarks/quality.py settings, randomized_svd, training loss of the last 20 steps, lr
3e-4) keep 1.010, reset 1.007, reproject 0.989. With the online projector P moves every
step, so "reset" would discard the moments every step and is rejected.

Parameter groups may set "project": None (default: project params with >= 2 dims whose
smaller matrix side exceeds rank), True (project every >= 2-D param, rank clipped to the
smaller side) or False (plain inner update on the full gradient; scale is not applied).
1-D params are never projected. State is tensors and ints only.
bf16 parameters: the update is computed in fp32 and written back with stochastic rounding.
Updates of parameters over 2**20 values are computed and applied one row chunk at a time
(memfit.optim.inner.row_chunks): no full-size fp32 update or weight copy is ever alive.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from memfit._utils.errors import ConfigError
from memfit.optim._base import StatePreservingOptimizer
from memfit.optim.inner import (
    INNER_CHOICES,
    Rows,
    adam_direction,
    inner_direction,
    inner_directions_by_rows,
    reset_moments,
    rotate_moments,
    row_chunks,
)
from memfit.optim.inner import state_bytes as inner_state_bytes
from memfit.optim.projectors import (
    PROJECTOR_CHOICES,
    align_signs,
    change_of_basis,
    online_pca_gradient,
    random_basis,
    randomized_svd_basis,
    svd_basis,
)
from memfit.optim.stochastic_rounding import apply_updates_by_rows_, make_generator, mix_seed

SUBSPACE_CHANGE_CHOICES: tuple[str, ...] = ("keep", "reset", "reproject")
DEFAULT_SUBSPACE_CHANGE = "reproject"

# APOLLO's norm-growth limiter: ||update_t|| <= 1.01 ||update_{t-1}||.
_NORM_GROWTH_LIMIT = 1.01

# Projectors whose P is regenerated from a stored seed and whose update is the raw gradient
# scaled by how much the inner rule changed R (APOLLO, APOLLO-Mini).
RAW_GRADIENT_PROJECTORS: tuple[str, ...] = ("random", "apollo_mini")

# Tags that keep the random streams of one (seed, parameter, step) independent.
_STREAM_RANDOMIZED_SVD, _STREAM_RANDOM_BASIS, _STREAM_ROUNDING = 1, 2, 3


def _check_choice(group: dict[str, Any], key: str, choices: tuple[Any, ...]) -> None:
    if group[key] not in choices:
        valid = ", ".join(str(choice) for choice in choices)
        raise ConfigError(f"GaLore {key}={group[key]!r} is not one of: {valid}")


def _check_positive_int(group: dict[str, Any], key: str) -> None:
    value = group[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"GaLore {key}={value!r} must be a positive integer")


def _validate(group: dict[str, Any]) -> None:
    _check_choice(group, "projector", PROJECTOR_CHOICES)
    _check_choice(group, "inner", INNER_CHOICES)
    _check_choice(group, "subspace_change", SUBSPACE_CHANGE_CHOICES)
    _check_choice(group, "project", (None, True, False))
    _check_positive_int(group, "rank")
    _check_positive_int(group, "update_gap")
    if group["projector"] == "online" and group["subspace_change"] == "reset":
        raise ConfigError(
            "GaLore subspace_change='reset' cannot be used with projector='online' "
            "(P moves every step); use one of: keep, reproject"
        )
    for key in ("lr", "eps", "weight_decay", "scale"):
        if group[key] < 0:
            raise ConfigError(f"GaLore {key}={group[key]!r} must be >= 0")


def _matrix(tensor: torch.Tensor) -> torch.Tensor:
    """fp32 view of a >= 2-D tensor as a matrix with its smaller side first (s x l)."""
    matrix = tensor.reshape(tensor.shape[0], -1).float()
    return matrix.T if matrix.shape[0] > matrix.shape[1] else matrix


def _unmatrix(update: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """Inverse of _matrix for an s x l update: back to param's shape."""
    rows = param.shape[0]
    columns = param.numel() // rows
    return (update.T if rows > columns else update).reshape(param.shape)


def _projected_back_by_rows(
    basis: torch.Tensor, direction: torch.Tensor, param: torch.Tensor
) -> Iterator[tuple[Rows, torch.Tensor]]:
    """_unmatrix(P @ direction, param) one row chunk of param at a time (row_chunks), so
    the full-size fp32 update never exists. P is s x r, direction r x l. A wide param's
    rows are the s rows of the update: chunk = P[rows] @ direction. A tall param's rows
    are its l columns (_matrix transposed it): chunk = (P @ direction[:, rows])^T."""
    tall = param.shape[0] > param.numel() // param.shape[0]
    for rows in row_chunks(param.shape):
        update = (basis @ direction[:, rows]).T if tall else basis[rows] @ direction
        yield rows, update.reshape(param[rows].shape)
        del update  # before the next chunk is computed


class GaLore(StatePreservingOptimizer):
    """Gradient low-rank projection optimizer (see the module docstring for the algorithm).

    Usable like any torch optimizer (loops, LR schedulers, transformers.Trainer) and inside
    LayerwiseOptimizer, which also uses project_gradient/step_projected to accumulate the
    r x l projected gradient across micro-batches instead of the full gradient.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        rank: int = 128,
        update_gap: int = 200,
        scale: float = 0.25,
        projector: str = "svd",
        inner: str = "adamw",
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        subspace_change: str = DEFAULT_SUBSPACE_CHANGE,
        online_lr_ratio: float = 5.0,
        online_orthogonality: float = 0.1,
        seed: int = 0,
        project: bool | None = None,
    ) -> None:
        defaults = {
            "lr": lr,
            "rank": rank,
            "update_gap": update_gap,
            "scale": scale,
            "projector": projector,
            "inner": inner,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": weight_decay,
            "subspace_change": subspace_change,
            "online_lr_ratio": online_lr_ratio,
            "online_orthogonality": online_orthogonality,
            "seed": seed,
            "project": project,
        }
        super().__init__(params, defaults)
        # R = P^T g of weights whose gradient was projected in backward (see
        # memfit/optim/backward_projection.py), summed over micro-batches; like .grad, not
        # part of the state and cleared by zero_grad.
        self._projected_grads: dict[torch.Tensor, torch.Tensor] = {}

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        _validate(self.param_groups[-1])

    # ----- which parameters are projected, and into what shape -------------------------

    @staticmethod
    def projection(shape: tuple[int, ...], group: dict[str, Any]) -> tuple[int, int, int] | None:
        """(s, r, l) of a parameter of ``shape`` in ``group``: g is s x l (s <= l), P s x r
        and R r x l; None when it gets the plain inner update. The planner calls this too."""
        if len(shape) < 2:
            return None
        rows = shape[0]
        small, large = sorted((rows, math.prod(shape) // rows))
        rank = 1 if group["projector"] == "apollo_mini" else group["rank"]
        if group["project"] is None:
            return (small, rank, large) if small > rank else None
        return (small, min(rank, small), large) if group["project"] else None

    @staticmethod
    def state_bytes(shape: tuple[int, ...], group: dict[str, Any]) -> int:
        """Bytes of the state kept for a parameter of ``shape`` in ``group`` (what
        state_dict holds after its first step; ints not counted)."""
        sides = GaLore.projection(shape, group)
        if sides is None:
            return inner_state_bytes(shape, group["inner"])
        small, rank, large = sides
        moments = inner_state_bytes((rank, large), group["inner"])
        if group["projector"] in RAW_GRADIENT_PROJECTORS:
            return moments + 4  # P is a seed; the limiter's last norm, a 0-d fp32 tensor
        if group["projector"] == "online":  # P and its own fp32 Adam moments
            return moments + 3 * 4 * small * rank
        return moments + 4 * small * rank

    @staticmethod
    def _rank(param: torch.Tensor, group: dict[str, Any]) -> int | None:
        """Effective rank if `param` is projected in `group`, else None."""
        sides = GaLore.projection(tuple(param.shape), group)
        return None if sides is None else sides[1]

    @staticmethod
    def accumulation_shape_of(shape: tuple[int, ...], group: dict[str, Any]) -> torch.Size | None:
        """Shape r x l of the projected gradient if gradients of a parameter of ``shape``
        can be accumulated in projected form, else None (unprojected, or a projector whose
        weight update needs the full gradient)."""
        sides = GaLore.projection(shape, group)
        if sides is None or group["projector"] in RAW_GRADIENT_PROJECTORS:
            return None
        return torch.Size(sides[1:])

    def accumulation_shape(self, param: torch.Tensor) -> torch.Size | None:
        group, _ = self.locate(param)
        return self.accumulation_shape_of(tuple(param.shape), group)

    def refresh_pending(self, param: torch.Tensor) -> bool:
        """Whether the next projection of `param`'s gradient computes a new P from it (its
        step is due a refresh that has not happened yet)."""
        group, _ = self.locate(param)
        state = self.state[param]
        return (state.get("projector_step") != state.get("step", 0)
                and self._refresh_due(state, group))

    @staticmethod
    def _refresh_due(state: dict[str, Any], group: dict[str, Any]) -> bool:
        if "projector_step" not in state or group["projector"] == "online":
            return True
        return state.get("step", 0) % group["update_gap"] == 0

    # ----- stepping ------------------------------------------------------------------

    def _has_gradient(self, param: torch.Tensor) -> bool:
        return param.grad is not None or param in self._projected_grads

    def _update_parameter(self, group: dict[str, Any], position: int,
                          param: torch.Tensor) -> None:
        projected_in_backward = self._projected_grads.pop(param, None)
        if projected_in_backward is not None:
            self._projected_update(param, group, position, projected_in_backward, None)
        elif self._rank(param, group) is None:
            self._full_update(param, group, position)
        else:
            g = _matrix(param.grad)
            projected = self._project(param, group, position, g)
            self._projected_update(param, group, position, projected, g)

    @torch.no_grad()
    def project_gradient(self, param: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """R = P^T g (fp32, accumulation_shape(param)) for one micro-batch's gradient.

        On a step that refreshes P, the first call computes the new P from `grad`; later
        calls in the same step reuse it (see LayerwiseOptimizer's projector_refresh).
        """
        group, position = self.locate(param)
        return self._project(param, group, position, _matrix(grad))

    @torch.no_grad()
    def step_projected(self, param: torch.Tensor, projected: torch.Tensor) -> None:
        """One update of `param` from its (accumulated) projected gradient R."""
        group, position = self.locate(param)
        self._projected_update(param, group, position, projected, None)

    # ----- gradients projected in backward (memfit/optim/backward_projection.py) ------

    def backward_projection_basis(self, param: torch.Tensor) -> torch.Tensor | None:
        """P (s x r) if this step's gradient of `param` may arrive as R = P^T g, else None:
        unprojected parameters, steps whose P is not computed yet (the SVD needs g), and the
        online and random projectors (their update needs g on every step)."""
        group, _ = self.locate(param)
        if self._rank(param, group) is None or group["projector"] in (
                "online", *RAW_GRADIENT_PROJECTORS):
            return None
        state = self.state[param]
        # P of this step exists once refreshed (layer-wise accumulation refreshes it from the
        # first micro-batch's gradient, in backward).
        current = state.get("projector_step") == state.get("step", 0)
        return state["projector"] if current or not self._refresh_due(state, group) else None

    def add_projected_gradient(self, param: torch.Tensor, projected: torch.Tensor) -> None:
        """Add one micro-batch's R = P^T g of `param`; the next step() consumes the sum."""
        buffered = self._projected_grads.get(param)
        self._projected_grads[param] = projected if buffered is None else buffered.add_(projected)

    def projected_gradients(self) -> list[torch.Tensor]:
        """The R buffers waiting for step() (clipping scales them with the grads)."""
        return list(self._projected_grads.values())

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        self._projected_grads.clear()

    def _full_update(self, param: torch.Tensor, group: dict[str, Any], position: int) -> None:
        state = self.state[param]
        step = state.get("step", 0)
        # The 8000 x 768 embedding and head: row chunks, widened to fp32 one at a time.
        directions = inner_directions_by_rows(
            state, param.grad, group["inner"], group["betas"], group["eps"]
        )
        state["step"] = step + 1
        apply_updates_by_rows_(
            param,
            directions,
            group["lr"],
            1 - group["lr"] * group["weight_decay"],
            mix_seed(group["seed"] + position, step, _STREAM_ROUNDING),
        )

    def _basis(
        self,
        state: dict[str, Any],
        group: dict[str, Any],
        rows: int,
        rank: int,
        device: torch.device,
    ) -> torch.Tensor:
        if group["projector"] in RAW_GRADIENT_PROJECTORS:
            generator = make_generator(state["projector_seed"], device)
            return random_basis(rows, rank, generator, device)
        return state["projector"]

    def _project(
        self, param: torch.Tensor, group: dict[str, Any], position: int, g: torch.Tensor
    ) -> torch.Tensor:
        """Refresh P if this step calls for it (once per step), then return P^T g."""
        state = self.state[param]
        rank = self._rank(param, group)
        step = state.get("step", 0)
        if state.get("projector_step") != step and self._refresh_due(state, group):
            self._refresh(state, group, position, g, rank, step)
        return self._basis(state, group, g.shape[0], rank, g.device).T @ g

    def _refresh(
        self,
        state: dict[str, Any],
        group: dict[str, Any],
        position: int,
        g: torch.Tensor,
        rank: int,
        step: int,
    ) -> None:
        name = group["projector"]
        old = (
            self._basis(state, group, g.shape[0], rank, g.device)
            if "projector_step" in state
            else None
        )
        if name == "online" and old is not None:
            pca_grad = online_pca_gradient(old, g, group["online_orthogonality"])
            direction = adam_direction(
                state, pca_grad, group["betas"], group["eps"], prefix="projector_"
            )
            new = old - group["online_lr_ratio"] * group["lr"] * direction
        elif name in ("svd", "online"):
            new = svd_basis(g, rank)
        elif name == "randomized_svd":
            seed = mix_seed(group["seed"] + position, step, _STREAM_RANDOMIZED_SVD)
            new = randomized_svd_basis(g, rank, make_generator(seed, g.device))
        else:
            state["projector_seed"] = mix_seed(group["seed"] + position, step, _STREAM_RANDOM_BASIS)
            new = random_basis(
                g.shape[0], rank, make_generator(state["projector_seed"], g.device), g.device
            )
        if old is not None and name in ("svd", "randomized_svd"):
            new = align_signs(new, old)
        if old is not None and group["subspace_change"] == "reset":
            reset_moments(state)
        elif old is not None and group["subspace_change"] == "reproject":
            rotate_moments(
                state, change_of_basis(new, old), group["inner"], torch.Size((rank, g.shape[1]))
            )
        if name not in RAW_GRADIENT_PROJECTORS:
            state["projector"] = new
        state["projector_step"] = step

    def _projected_update(
        self,
        param: torch.Tensor,
        group: dict[str, Any],
        position: int,
        projected: torch.Tensor,
        g: torch.Tensor | None,
    ) -> None:
        state = self.state[param]
        step = state.get("step", 0)
        direction = inner_direction(state, projected, group["inner"], group["betas"], group["eps"])
        if group["projector"] in RAW_GRADIENT_PROJECTORS:
            if g is None:
                raise RuntimeError(f"projector={group['projector']!r} updates need the full "
                                   "gradient")
            tensor_wise = group["projector"] == "apollo_mini"
            update = _unmatrix(self._apollo_update(
                state, g, projected, direction, group["eps"], tensor_wise), param)
            updates = ((rows, update[rows]) for rows in row_chunks(param.shape))
        else:
            updates = _projected_back_by_rows(state["projector"], direction, param)
        state["step"] = step + 1
        apply_updates_by_rows_(
            param,
            updates,
            group["lr"] * group["scale"],
            1 - group["lr"] * group["weight_decay"],
            mix_seed(group["seed"] + position, step, _STREAM_ROUNDING),
        )

    @staticmethod
    def _apollo_update(
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
