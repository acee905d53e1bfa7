"""optimizer.name=galore: memfit's GaLore family (memfit.optim.GaLore), projecting the
weights of ``groups.galore_targets`` (optimizer.galore.modules narrows them).

State per parameter: GaLore.state_bytes, the optimizer's own account (P, the inner rule's
moments on R, the online projector's moments of P; a seed for random and apollo_mini).
Scratch of one parameter's step, the largest of (s x l gradient viewed as g, s <= l; R and
the inner direction r x l; k = r + 8 sketch columns):
  refresh   svd: U (s x s) and V^T (s x l); randomized_svd: the sketches (l x k, s x k)
            and the small SVD (k x l); online: three s x l products of the PCA gradient;
            random/apollo_mini: the s x r Gaussian P
  update    P^T g, the direction and the projected-back update in row chunks (3 x r x l
            and chunks); random/apollo_mini: the raw gradient scaled and limited (2 x s x l)
plus an fp32 copy of a bf16 g. Unprojected parameters: chunks of the inner rule.
Layer-wise accumulation buffers: LayerwiseOptimizer.buffer_bytes.
"""

from __future__ import annotations

from torch import nn

from memfit.config.ignored import Rule
from memfit.config.schema import (
    DistributedStrategy,
    GaloreConfig,
    GaloreInner,
    GaloreProjector,
    Precision,
)
from memfit.optim.galore import GaLore
from memfit.optim.galore_layout import RAW_GRADIENT_PROJECTORS
from memfit.optim.inner import chunked_update_scratch_bytes
from memfit.optim.layerwise import LayerwiseOptimizer
from memfit.techniques.optimizers.adamw import ADAM_OPTIONS
from memfit.techniques.optimizers.groups import galore_targets
from memfit.techniques.optimizers.options import adam_options
from memfit.techniques.optimizers.setting import OptimizerSetting
from memfit.techniques.optimizers.spec import (
    LAYERWISE,
    PLAIN,
    PURE,
    PURE_LAYERWISE,
    BenchLine,
    Factory,
    OptimizerSpec,
    Param,
    ParamCost,
    per_param,
)
from memfit.techniques.optimizers.step_work import ADAFACTOR, ADAMW, ADAMW8BIT
from memfit.techniques.quantize import compute_dtype
from memfit.techniques.work import Work, matmul, memory

_SKETCH_OVERSAMPLE = 8  # memfit.optim.projectors.randomized_svd_basis


def group_settings(galore: GaloreConfig, projected: bool) -> dict:
    """The GaLore parameter-group options a parameter gets (what ``projection`` reads)."""
    return {"rank": galore.rank, "projector": galore.projector.value,
            "inner": galore.inner.value, "project": projected}


def _factory(setting: OptimizerSetting) -> Factory:
    galore = setting.optimizer.galore
    return lambda groups: GaLore(
        groups, **adam_options(setting.optimizer, ADAM_OPTIONS), rank=galore.rank,
        update_gap=galore.update_gap,
        scale=galore.scale, projector=galore.projector.value, inner=galore.inner.value,
        subspace_change=galore.subspace_change.value)


def _refresh_scratch(projector: str, small: int, rank: int, large: int) -> int:
    svd = 4 * (small * small + small + small * large)  # U, S, V^T of an s x l g
    if projector == GaloreProjector.SVD.value:
        return svd
    if projector == GaloreProjector.RANDOMIZED_SVD.value:
        sketch = min(rank + _SKETCH_OVERSAMPLE, small)
        return 4 * sketch * (2 * large + 2 * small + large)
    if projector == GaloreProjector.ONLINE.value:  # its first refresh is an SVD
        return max(3 * 4 * small * large, svd)
    return 4 * small * rank


def _cost(param: Param, setting: OptimizerSetting) -> ParamCost:
    galore = setting.optimizer.galore
    group = group_settings(galore, param.projected)
    inner = galore.inner.value
    chunks = chunked_update_scratch_bytes(param.numel, inner)
    buffer = LayerwiseOptimizer.buffer_bytes(
        param.nbytes, GaLore.accumulation_shape_of(param.shape, group),
        galore.layerwise_refresh.value)
    state = GaLore.state_bytes(param.shape, group)
    sides = GaLore.projection(param.shape, group)
    if sides is None:
        return ParamCost(state, chunks, buffer)
    small, rank, large = sides
    widened = 4 * small * large if param.element_size < 4 else 0
    update = 4 * 3 * rank * large + chunks
    if group["projector"] in RAW_GRADIENT_PROJECTORS:
        update += 2 * 4 * small * large
    refresh = _refresh_scratch(group["projector"], small, rank, large)
    return ParamCost(state, widened + max(refresh, update), buffer)


_INNER = {GaloreInner.ADAMW: ADAMW, GaloreInner.ADAMW8BIT: ADAMW8BIT,
          GaloreInner.ADAFACTOR: ADAFACTOR}


def _refresh_flops(projector: str, small: int, rank: int, large: int) -> int:
    """FLOPs of one projector refresh of an s x l gradient (Golub & Van Loan's counts for
    the SVD: ~4 s^2 l + 8 s^3 for U, S and V^T; randomized SVD: the sketch, a QR and
    the small SVD of k = r + 8 columns; online: three s x l x r products)."""
    if projector == GaloreProjector.SVD.value:
        return 4 * small * small * large + 8 * small**3
    if projector == GaloreProjector.RANDOMIZED_SVD.value:
        sketch = min(rank + _SKETCH_OVERSAMPLE, small)
        return 4 * sketch * small * large + 4 * sketch * sketch * (small + large)
    if projector == GaloreProjector.ONLINE.value:
        return 3 * 2 * small * large * rank
    return small * rank  # random / apollo_mini: a Gaussian P


def _step_work(params: list[Param], costs: list[ParamCost], setting: OptimizerSetting) -> Work:
    """Per projected weight (s x l gradient g, rank r): R = P^T g (2 r s l FLOPs; on the
    steps that keep P, R comes from backward instead where it is projected there:
    _backward_work) and the update P N (2 r s l), the inner rule on R (r x l), the weight's
    update from the full-size direction (4 passes of s x l); the refresh amortised over
    update_gap steps. Other parameters: the inner rule over them."""
    galore = setting.optimizer.galore
    inner = _INNER[galore.inner]
    in_backward = projects_in_backward(setting)
    total = Work()
    for param in params:
        sides = GaLore.projection(param.shape, group_settings(galore, param.projected))
        if sides is None:
            total = total.plus(inner.of(param.numel))
            continue
        small, rank, large = sides
        refresh = _refresh_flops(galore.projector.value, small, rank, large)
        projection = 2 * rank * small * large
        if in_backward and param.linear_weight:
            projection //= galore.update_gap  # on refresh steps only
        total = total.plus(inner.of(rank * large)).plus(
            matmul(projection + 2 * rank * small * large + refresh // galore.update_gap,
                   "float32", rank, 2)
        ).plus(memory(4 * 4 * small * large, 4))
    return total


def _backward_work(params: list[Param], setting: OptimizerSetting, tokens: int
                   ) -> tuple[Work, Work]:
    """With optimizer.galore.project_in_backward (memfit/optim/backward_projection.py), on
    the update_gap - 1 of every update_gap steps that keep P, a projected linear weight
    (out x in) gets no gradient D^T X (2 T out in FLOPs in the compute dtype, as the trace
    counts it); R = (D P)^T X or (X P)^T D is formed instead from D and X cast to fp32
    (2 T r (out + in) FLOPs, and the casts' bytes when the compute dtype is not fp32). T:
    the micro-batch's tokens."""
    removed = added = Work()
    if not projects_in_backward(setting):
        return removed, added
    galore = setting.optimizer.galore
    gap = galore.update_gap
    dtype = str(compute_dtype(setting.precision)).removeprefix("torch.")
    for param in params:
        sides = GaLore.projection(param.shape, group_settings(galore, param.projected))
        if sides is None or not param.linear_weight:
            continue
        (out, inputs), rank = param.shape, sides[1]
        removed = removed.plus(matmul(2 * tokens * out * inputs * (gap - 1) // gap, dtype,
                                      min(tokens, out, inputs)))
        added = added.plus(matmul(2 * tokens * rank * (out + inputs) * (gap - 1) // gap,
                                  "float32", rank, 2))
        if dtype != "float32":  # D and X read in the compute dtype (2 B), written in fp32
            added = added.plus(memory(6 * tokens * (out + inputs) * (gap - 1) // gap, 2))
    return removed, added


def projects_in_backward(setting: OptimizerSetting) -> bool:
    """Whether GaLore takes R = P^T G from linear layers' backward (see
    memfit/optim/backward_projection.py): not where a step needs every full gradient
    (online/random projectors), where P lives on the host between steps (optimizer
    offload), where GradScaler must unscale the gradients (fp16) or where FSDP2 shards the
    weights (R would be a partial sum over each process's micro-batch)."""
    optimizer = setting.optimizer
    return (optimizer.name == "galore" and optimizer.galore.project_in_backward
            and setting.strategy is not DistributedStrategy.FSDP
            and optimizer.galore.projector in (GaloreProjector.SVD,
                                               GaloreProjector.RANDOMIZED_SVD)
            and not setting.offloaded and setting.precision is not Precision.FP16)


def _row_shard_state(param: Param, setting: OptimizerSetting, rows: int) -> int:
    return GaLore.row_shard_state_bytes(
        param.shape, group_settings(setting.optimizer.galore, param.projected), rows)


def _targets(model: nn.Module, setting: OptimizerSetting) -> set[int]:
    return galore_targets(model, setting.optimizer.galore.modules)


# What GaLore steps on FSDP2's row shards (memfit.optim.galore: P from the gathered
# gradient, R = P^T G summed over the processes).
_ON_SHARDS = ((GaloreProjector.SVD, GaloreProjector.RANDOMIZED_SVD), (GaloreInner.ADAMW,))


def _fsdp_refusal(setting: OptimizerSetting) -> str | None:
    galore = setting.optimizer.galore
    projectors, inners = _ON_SHARDS
    if galore.projector not in projectors:
        return (f"optimizer.galore.projector={galore.projector}: its update reads the whole "
                "gradient on every step, not once per refresh; use optimizer.galore.projector="
                + " or ".join(p.value for p in projectors))
    if galore.inner not in inners:
        return (f"optimizer.galore.inner={galore.inner}: its state is factored or quantized "
                "over whole rows of R, which the processes divide; use optimizer.galore.inner="
                + " or ".join(i.value for i in inners))
    return None


def _cheaper(setting: OptimizerSetting) -> dict | None:
    if setting.optimizer.galore.inner is GaloreInner.ADAMW:
        return {"optimizer.galore.inner": "adamw8bit"}
    return None


# Keys its own settings make ignored (config/ignored.py's rules).
_IGNORED = (
    Rule(("optimizer.galore.layerwise_refresh",), lambda c: not c.optimizer.layerwise,
         lambda c: "it applies with optimizer.layerwise=true"),
    Rule(("optimizer.galore.project_in_backward",),
         lambda c: c.optimizer.galore.projector not in (GaloreProjector.SVD,
                                                        GaloreProjector.RANDOMIZED_SVD),
         lambda c: f"optimizer.galore.projector={c.optimizer.galore.projector} needs every "
                   "full gradient (it applies with svd or randomized_svd)"),
    Rule(("optimizer.galore.rank",),
         lambda c: c.optimizer.galore.projector is GaloreProjector.APOLLO_MINI,
         lambda c: "optimizer.galore.projector=apollo_mini projects to rank 1"),
)


def _line(projector: GaloreProjector, inner: GaloreInner, *modes: tuple[bool, str],
          **more: str) -> BenchLine:
    label = f"galore {projector}/{inner}" + "".join(f", {k}={v}" for k, v in more.items())
    settings = {"optimizer.name": "galore", "optimizer.galore.projector": projector.value,
                "optimizer.galore.inner": inner.value,
                **{f"optimizer.galore.{key}": value for key, value in more.items()}}
    return BenchLine(label, settings, modes)


# Every projector with adamw and adamw8bit; the default run measures the variants where
# the picture changes (the projector hardly changes memory, so they use randomized_svd).
_RSVD, _ADAMW, _8BIT = GaloreProjector.RANDOMIZED_SVD, GaloreInner.ADAMW, GaloreInner.ADAMW8BIT
_BENCH = (*(_line(p, _ADAMW, PLAIN, LAYERWISE) if p is _RSVD else _line(p, _ADAMW, PLAIN)
            for p in GaloreProjector),
          _line(_RSVD, _ADAMW, PLAIN, project_in_backward="false"),
          *(_line(p, _8BIT, PLAIN, LAYERWISE, PURE, PURE_LAYERWISE) if p is _RSVD
            else _line(p, _8BIT) for p in GaloreProjector),
          _line(_RSVD, GaloreInner.ADAFACTOR, PURE_LAYERWISE))

SPEC = OptimizerSpec(
    name="galore",
    docs_row=("`memfit.optim.GaLore`, ours (the reference code cannot be resumed, loses "
              "accumulation per layer, and its 8-bit variant breaks on bitsandbytes 0.50 and "
              "calls CUDA on CPU)", "P (s x r, fp32) + inner moments on r x l"),
    options={**ADAM_OPTIONS, "galore": None}, ignored=_IGNORED, bench=_BENCH,
    factory=_factory, costs=per_param(_cost), targets=_targets,
    step_work=_step_work, backward_work=_backward_work,
    rounds_stochastically=True, steps_local_rows=True, row_shard_state=_row_shard_state,
    fsdp_refusal=_fsdp_refusal, cheaper=_cheaper,
    # Layer-wise with 8-bit moments on R in pure bf16 (the least memory), and the same with
    # fp32 moments: what FSDP2 shards (8-bit inner state is not divided).
    plan_methods=(("full-galore", {"optimizer.galore.inner": "adamw"}),
                  ("full-galore8bit-layerwise", {"optimizer.galore.inner": "adamw8bit",
                                                 "optimizer.layerwise": True,
                                                 "precision": "bf16-pure"}),
                  ("full-galore-layerwise", {"optimizer.galore.inner": "adamw",
                                             "optimizer.layerwise": True,
                                             "precision": "bf16-pure"})))
