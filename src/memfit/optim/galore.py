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
Which weights are projected, the shapes and the state's bytes: optim/galore_layout.py.
bf16 parameters: the update is computed in fp32 and written back with stochastic rounding.
Updates of parameters over 2**20 values are computed and applied one row chunk at a time
(memfit.optim.inner.row_chunks): no full-size fp32 update or weight copy is ever alive.

Row shards (FSDP2; `set_row_shards`): a parameter may hold only its rows of a whole tensor
(dim 0 divided as torch.chunk divides it; .grad is those rows of the summed gradient), and
its rows then move exactly as GaLore on the whole tensor would move them. Which parameters
are projected, at what rank, follows the whole shape. A refresh gathers the whole gradient
of one parameter at a time; every process computes the same P from it and keeps all of it
(s x r). A wide parameter's rows are rows of g: R = sum over processes of
P[local rows]^T g_local (r x l, one all-reduce; its moments are the same on every
process) and the rows move by P[local rows] @ inner(R). A tall parameter's rows are
columns of g: R = P^T g_local is r x (local rows), purely local, and so are its moments
(adamw and the reprojection never mix columns); the rows move by (P @ inner(R))^T.
Unprojected parameters take the elementwise adamw step on their rows as they are.
Shards support projector svd or randomized_svd with inner adamw only: the other
projectors need the whole gradient on every step, adamw8bit quantises blocks of the whole
tensor and adafactor's statistics span it. `state_placement` says along which dim each
state tensor is divided across processes. Processes make the same collectives in the
same order (parameter order), a process holding no rows of a parameter included.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from memfit._utils.errors import ConfigError
from memfit.optim import galore_layout
from memfit.optim._base import StatePreservingOptimizer
from memfit.optim.galore_layout import (
    RAW_GRADIENT_PROJECTORS,
    from_oriented,
    is_tall,
    oriented_matrix,
    projected_back_by_rows,
)
from memfit.optim.inner import (
    INNER_CHOICES,
    adam_direction,
    inner_direction,
    inner_directions_by_rows,
    reset_moments,
    rotate_moments,
    row_chunks,
)
from memfit.optim.projectors import (
    PROJECTOR_CHOICES,
    align_signs,
    apollo_scaled_gradient,
    change_of_basis,
    online_pca_gradient,
    random_basis,
    randomized_svd_basis,
    svd_basis,
)
from memfit.optim.stochastic_rounding import apply_updates_by_rows_, make_generator, mix_seed

if TYPE_CHECKING:
    from memfit.optim.row_shards import RowShard

SUBSPACE_CHANGE_CHOICES: tuple[str, ...] = ("keep", "reset", "reproject")
DEFAULT_SUBSPACE_CHANGE = "reproject"

# What row-sharded parameters support, and why nothing else (ConfigError messages).
_SHARDED_CHOICES: dict[str, tuple[tuple[str, ...], str]] = {
    "projector": (("svd", "randomized_svd"),
                  "the online, random and apollo_mini updates need the whole gradient every step"),
    "inner": (("adamw",), "adamw8bit quantises blocks of the whole tensor and adafactor's "
              "statistics and clipping span the whole gradient"),
}

# State keys that hold ints, or P (s x r): the same whole value on every process.
_REPLICATED_KEYS = ("step", "inner_step", "projector_step", "projector")
_MOMENT_KEYS = ("exp_avg", "exp_avg_sq")

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
        # Parameters holding only some rows of a whole tensor (set_row_shards).
        self._row_shards: dict[torch.Tensor, RowShard] = {}

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        _validate(self.param_groups[-1])

    # ----- parameters holding rows of a whole tensor (FSDP2) ---------------------------

    def set_row_shards(self, shards: dict[torch.Tensor, RowShard]) -> None:
        """Declare that each param of `shards` holds its shard's rows of a whole tensor (and
        its .grad those rows of the summed gradient); replaces earlier declarations. Their
        steps then make collectives, which every process must reach in the same order.
        ConfigError if a shard's group sets a projector or inner rule shards do not
        support; ValueError if a param's shape is not its shard's rows."""
        for param, shard in shards.items():
            group, _ = self.locate(param)
            if param.shape != torch.Size((shard.rows, *shard.full_shape[1:])):
                raise ValueError(f"a parameter of shape {tuple(param.shape)} cannot hold rows "
                                 f"{shard.start}:{shard.start + shard.rows} of a tensor of "
                                 f"shape {tuple(shard.full_shape)}")
            for key, (choices, reason) in _SHARDED_CHOICES.items():
                if group[key] not in choices:
                    raise ConfigError(
                        f"GaLore {key}={group[key]!r} cannot step row-sharded (FSDP2) "
                        f"parameters; use one of: {', '.join(choices)} ({reason})"
                    )
        self._row_shards = dict(shards)

    def _whole_shape(self, param: torch.Tensor) -> torch.Size:
        shard = self._row_shards.get(param)
        return param.shape if shard is None else shard.full_shape

    def _whole_matrix(self, param: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """The whole tensor's g (s x l) from this process's `g` of `param` (s x l, or the
        param's rows of it): the sharded side gathered from every process."""
        shard = self._row_shards.get(param)
        if shard is None:
            return g
        # The param's rows are g's columns when the whole tensor is tall (oriented_matrix).
        return shard.gather(g.T).T if is_tall(shard.full_shape) else shard.gather(g)

    def _local_basis(self, param: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
        """The rows of P (s x r) that map back onto `param`'s rows: a wide param's rows
        of P, all of P for a tall param (its rows are columns of g) or a whole one."""
        shard = self._row_shards.get(param)
        if shard is None or is_tall(shard.full_shape):
            return basis
        return shard.local(basis)

    def state_placement(self, param: torch.Tensor, key: str) -> int | None:
        """The dim along which ``state[param][key]`` is divided across processes, or None
        when every process holds the same whole value: ints, P, a wide param's moments on
        R (r x l) and everything of a param that is not row-sharded. Moments of an
        unprojected param (its rows' shape) are divided along 0, a tall param's moments on
        R (r x local rows) along 1. KeyError for a key a row shard's state never holds."""
        shard = self._row_shards.get(param)
        if shard is None or key in _REPLICATED_KEYS:
            return None
        if key not in _MOMENT_KEYS:
            raise KeyError(f"GaLore keeps no state {key!r} for a row-sharded parameter")
        if self._rank(param, self.locate(param)[0]) is None:
            return 0  # moments shaped like the param's rows
        # Moments on R (r x l): a tall param's local rows are columns of R.
        return 1 if is_tall(shard.full_shape) else None

    # ----- which parameters are projected, and into what shape (galore_layout) ---------

    # Functions of a shape and a group's options, which the planner calls too.
    projection = staticmethod(galore_layout.projection)
    state_bytes = staticmethod(galore_layout.state_bytes)
    row_shard_state_bytes = staticmethod(galore_layout.row_shard_state_bytes)
    accumulation_shape_of = staticmethod(galore_layout.accumulation_shape_of)

    def _rank(self, param: torch.Tensor, group: dict[str, Any]) -> int | None:
        """Effective rank if `param` (the whole tensor, for a row shard) is projected in
        `group`, else None."""
        sides = galore_layout.projection(tuple(self._whole_shape(param)), group)
        return None if sides is None else sides[1]

    def accumulation_shape(self, param: torch.Tensor) -> torch.Size | None:
        """accumulation_shape_of the whole tensor, except that a row-sharded tall param's
        R has only its rows as columns (r x local rows)."""
        group, _ = self.locate(param)
        shape = self.accumulation_shape_of(tuple(self._whole_shape(param)), group)
        shard = self._row_shards.get(param)
        if shape is None or shard is None or not is_tall(shard.full_shape):
            return shape
        return torch.Size((shape[0], shard.rows))

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
            g = oriented_matrix(param.grad, self._whole_shape(param))
            projected = self._project(param, group, position, g)
            self._projected_update(param, group, position, projected, g)

    @torch.no_grad()
    def project_gradient(self, param: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """R = P^T g (fp32, accumulation_shape(param)) for one micro-batch's gradient.

        On a step that refreshes P, the first call computes the new P from `grad`; later
        calls in the same step reuse it (see LayerwiseOptimizer's projector_refresh). For
        a row shard, `grad` is the param's rows and R is complete: summed over processes
        for a wide param, the param's own columns of R for a tall one.
        """
        group, position = self.locate(param)
        g = oriented_matrix(grad, self._whole_shape(param))
        return self._project(param, group, position, g)

    @torch.no_grad()
    def step_projected(self, param: torch.Tensor, projected: torch.Tensor) -> None:
        """One update of `param` from its (accumulated) projected gradient R."""
        group, position = self.locate(param)
        self._projected_update(param, group, position, projected, None)

    # ----- gradients projected in backward (memfit/optim/backward_projection.py) ------

    def backward_projection_basis(self, param: torch.Tensor) -> torch.Tensor | None:
        """P (s x r) if this step's gradient of `param` may arrive as R = P^T g, else None:
        unprojected parameters, steps whose P is not computed yet (the SVD needs g), the
        online and random projectors (their update needs g on every step), and row shards
        (their R is a sum over processes, made in _project)."""
        group, _ = self.locate(param)
        if (param in self._row_shards or self._rank(param, group) is None
                or group["projector"] in ("online", *RAW_GRADIENT_PROJECTORS)):
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
            self._rounding_seed(param, group, position, step),
        )

    def _rounding_seed(
        self, param: torch.Tensor, group: dict[str, Any], position: int, step: int
    ) -> int:
        seed = mix_seed(group["seed"] + position, step, _STREAM_ROUNDING)
        shard = self._row_shards.get(param)
        # Each shard's rows would otherwise round with the same noise as every other's.
        return seed if shard is None else mix_seed(seed, shard.start)

    def _basis(self, state: dict[str, Any], group: dict[str, Any], rows: int, rank: int,
               device: torch.device) -> torch.Tensor:
        if group["projector"] in RAW_GRADIENT_PROJECTORS:
            generator = make_generator(state["projector_seed"], device)
            return random_basis(rows, rank, generator, device)
        return state["projector"]

    def _project(
        self, param: torch.Tensor, group: dict[str, Any], position: int, g: torch.Tensor
    ) -> torch.Tensor:
        """Refresh P if this step calls for it (once per step), then return R = P^T g.

        g is `param`'s oriented gradient (oriented_matrix): s x l, or for a row shard
        s x (local rows) when tall and (local rows) x l when wide.
        """
        state = self.state[param]
        rank = self._rank(param, group)
        step = state.get("step", 0)
        if state.get("projector_step") != step and self._refresh_due(state, group):
            self._refresh(state, group, position, self._whole_matrix(param, g), rank, step,
                          torch.Size((rank, g.shape[1])))
        shard = self._row_shards.get(param)
        if shard is None or is_tall(shard.full_shape):
            basis = self._basis(state, group, g.shape[0], rank, g.device)
            return basis.T @ g  # r x l, or r x (local rows) for a tall shard
        # Wide shard: R = P^T G sums over G's rows, which the processes divide (r x l).
        return shard.sum_(shard.local(state["projector"]).T @ g)

    def _refresh(self, state: dict[str, Any], group: dict[str, Any], position: int,
                 g: torch.Tensor, rank: int, step: int, moment_shape: torch.Size) -> None:
        """New P (s x r) from the whole g (s x l); the moments (`moment_shape`: r x l, or
        r x (local rows) for a tall row shard) follow subspace_change."""
        name = group["projector"]
        old = (self._basis(state, group, g.shape[0], rank, g.device)
               if "projector_step" in state else None)
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
            rotate_moments(state, change_of_basis(new, old), group["inner"], moment_shape)
        if name not in RAW_GRADIENT_PROJECTORS:
            state["projector"] = new
        state["projector_step"] = step

    def _projected_update(self, param: torch.Tensor, group: dict[str, Any], position: int,
                          projected: torch.Tensor, g: torch.Tensor | None) -> None:
        state = self.state[param]
        step = state.get("step", 0)
        direction = inner_direction(state, projected, group["inner"], group["betas"], group["eps"])
        if group["projector"] in RAW_GRADIENT_PROJECTORS:
            if g is None:
                raise RuntimeError(f"projector={group['projector']!r} updates need the full "
                                   "gradient")
            tensor_wise = group["projector"] == "apollo_mini"
            update = from_oriented(apollo_scaled_gradient(
                state, g, projected, direction, group["eps"], tensor_wise), param)
            updates = ((rows, update[rows]) for rows in row_chunks(param.shape))
        else:
            updates = projected_back_by_rows(
                self._local_basis(param, state["projector"]), direction, param,
                is_tall(self._whole_shape(param)),
            )
        state["step"] = step + 1
        apply_updates_by_rows_(
            param,
            updates,
            group["lr"] * group["scale"],
            1 - group["lr"] * group["weight_decay"],
            self._rounding_seed(param, group, position, step),
        )

