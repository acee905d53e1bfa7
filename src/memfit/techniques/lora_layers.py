"""memfit's own LoRA layers, for the modules PEFT's cannot adapt faithfully. They follow
PEFT's conventions (``LoraLayer``: ``lora_A`` / ``lora_B`` keyed by adapter name,
``merge`` / ``unmerge``, ``get_base_layer``), are handed to PEFT through its custom-module
mechanism (``LoraConfig._register_custom_module``) and so save, load, train and merge
with PEFT's machinery:

- ``SubclassConv``: a Conv1d/2d/3d *subclass* (EfficientNet's same-padding conv). PEFT
  builds its factors with ``type(base_layer)(in, r, kernel, stride, padding)``, which a
  subclass's own ``__init__`` rejects or misreads. Here ``lora_A`` is a copy of the layer
  itself with r output channels, so the update sees the input exactly as the layer does
  (its padding runs); ``lora_B`` is a plain 1x1 conv. Then B(A(x)) = conv(pad(x), B A):
  the merged weight W + s B A in the subclass gives the adapted output.
- ``FusedPartsLinear``: a fused q,k,v nn.Linear or transformers Conv1D; one factor pair per
  named part (``lora_A[adapter][part]`` (r, in), ``lora_B[adapter][part]`` (rows, r)),
  added to that part's output rows only.
- ``FusedPartsAttention``: nn.MultiheadAttention, whose forward reads ``in_proj_weight``
  directly: it runs with ``in_proj_weight + delta``, delta (3 * d, d) zero outside the
  named parts' rows (as PEFT's own MultiheadAttention layer does; no lora_dropout there).

Saved keys of parts keep the adapter name, as PEFT does for nested factors:
``blocks.0.attn.qkv.lora_A.default.q.weight`` ((r, in); ``lora_B``: (rows of q, r)).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch
from peft.tuners.lora import LoraLayer
from peft.tuners.lora.layer import Conv1d as PeftConv1d
from peft.tuners.lora.layer import Conv2d as PeftConv2d
from peft.tuners.lora.layer import Conv3d as PeftConv3d
from peft.tuners.tuners_utils import check_adapters_to_merge
from torch import Tensor, nn
from torch.func import functional_call

from memfit._utils.errors import ConfigError
from memfit.techniques.lora_parts import Rows, is_conv1d

_PLAIN_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _scaling(config, r: int) -> float:
    return config.lora_alpha / (math.sqrt(r) if config.use_rslora else r)


def _rank_sized_copy(conv: nn.Module, r: int) -> nn.Module:
    """``conv`` (any Conv subclass) with r output channels and no bias: its forward, its
    padding logic and settings, new weights (r, in / groups, *kernel) — never a copy of
    the base weight (the memo hands deepcopy None for the base's parameters)."""
    memo = {id(p): None for p in conv._parameters.values() if p is not None}
    clone = copy.deepcopy(conv, memo)
    weight = conv.weight
    clone.weight = nn.Parameter(torch.empty((r, *weight.shape[1:]), device=weight.device,
                                            dtype=weight.dtype))
    clone.bias = None
    clone.out_channels = r
    return clone


class _SubclassConv:
    """Mixed into PEFT's ConvNd layers: only the factors are built differently."""

    def update_layer(self, adapter_name: str, r: int, lora_alpha: float, config,
                     **kwargs) -> None:
        base = self.get_base_layer()
        if config.use_dora or base.groups > 1:
            raise ConfigError(f"adapter: a {type(base).__name__} (a Conv subclass) takes plain "
                              "LoRA with groups=1 only; set adapter.dora=false or leave it out "
                              "with adapter.restrict_to")
        self.r[adapter_name], self.lora_alpha[adapter_name] = r, lora_alpha
        self.scaling[adapter_name] = _scaling(config, r)
        self.use_rslora[adapter_name], self.use_dora[adapter_name] = config.use_rslora, False
        self.lora_bias[adapter_name] = False
        self.lora_dropout[adapter_name] = (nn.Dropout(config.lora_dropout)
                                           if config.lora_dropout > 0 else nn.Identity())
        plain = _PLAIN_CONVS[base.weight.dim() - 3]
        self.lora_A[adapter_name] = _rank_sized_copy(base, r)
        self.lora_B[adapter_name] = plain(r, self.out_features, 1, bias=False,
                                          device=base.weight.device, dtype=base.weight.dtype)
        self.reset_lora_parameters(adapter_name, config.init_lora_weights)
        self._move_adapter_to_device_of_base_layer(adapter_name)
        self.set_adapter(self.active_adapters, inference_mode=config.inference_mode)


class SubclassConv1d(_SubclassConv, PeftConv1d):
    pass


class SubclassConv2d(_SubclassConv, PeftConv2d):
    pass


class SubclassConv3d(_SubclassConv, PeftConv3d):
    pass


class FusedParts(nn.Module, LoraLayer):
    """Factors per part of a fused projection; ``rows``: part -> [start, stop)."""

    def __init__(self, base_layer: nn.Module, adapter_name: str, config, rows: Rows,
                 r: int = 0, lora_alpha: float = 1, **kwargs) -> None:
        if config.use_dora:
            raise ConfigError("adapter.dora=true: DoRA cannot be placed on parts of a fused "
                              "q,k,v projection; set adapter.dora=false or target it whole "
                              "(adapter.targets=attention)")
        super().__init__()
        LoraLayer.__init__(self, base_layer)
        self.rows = dict(rows)
        self._active_adapter = adapter_name
        self.update_layer(adapter_name, r, lora_alpha, config)

    def update_layer(self, adapter_name: str, r: int, lora_alpha: float, config,
                     **kwargs) -> None:
        self.r[adapter_name], self.lora_alpha[adapter_name] = r, lora_alpha
        self.scaling[adapter_name] = _scaling(config, r)
        self.lora_dropout[adapter_name] = (nn.Dropout(config.lora_dropout)
                                           if config.lora_dropout > 0 else nn.Identity())
        # Built as PEFT builds its factors, then moved to the base's device and dtype (a
        # 4-bit base keeps them in float); in_features as PEFT reads it (bitsandbytes too).
        self.lora_A[adapter_name] = nn.ModuleDict(
            {part: nn.Linear(self.in_features, r, bias=False) for part in self.rows})
        self.lora_B[adapter_name] = nn.ModuleDict(
            {part: nn.Linear(r, stop - start, bias=False)
             for part, (start, stop) in self.rows.items()})
        if config.init_lora_weights is not False:  # as PEFT: A like a Linear's, B zero
            for part in self.rows:
                nn.init.kaiming_uniform_(self.lora_A[adapter_name][part].weight, a=math.sqrt(5))
                nn.init.zeros_(self.lora_B[adapter_name][part].weight)
        self._move_adapter_to_device_of_base_layer(adapter_name)
        self.set_adapter(self.active_adapters, inference_mode=config.inference_mode)

    def part_delta(self, adapter: str, part: str) -> Tensor:
        """s B A of one part: (rows of the part, in)."""
        return (self.lora_B[adapter][part].weight @ self.lora_A[adapter][part].weight
                * self.scaling[adapter])

    def _weight_rows(self, start: int, stop: int) -> Tensor:
        """A view of rows [start, stop) of the fused weight, laid out (rows, in)."""
        base = self.get_base_layer()
        if isinstance(base, nn.MultiheadAttention):
            return base.in_proj_weight.data[start:stop]
        if is_conv1d(base):  # weight (in, out): the parts are columns
            return base.weight.data[:, start:stop].T
        return base.weight.data[start:stop]

    def _fold(self, adapter_names: list[str], sign: int) -> None:
        for adapter in adapter_names:
            if adapter not in self.lora_A:
                continue
            for part, (start, stop) in self.rows.items():
                target = self._weight_rows(start, stop)
                if not target.is_floating_point():  # memfit merge dequantizes a 4-bit base first
                    raise ConfigError(f"cannot fold LoRA parts into a {target.dtype} weight; "
                                      "dequantize the base first")
                target += sign * self.part_delta(adapter, part).to(target.dtype)

    def merge(self, safe_merge: bool = False, adapter_names: list[str] | None = None) -> None:
        adapter_names = check_adapters_to_merge(self, adapter_names)
        self._fold(adapter_names, +1)
        self.merged_adapters.extend(name for name in adapter_names if name in self.lora_A)

    def unmerge(self) -> None:
        while self.merged_adapters:
            self._fold([self.merged_adapters.pop()], -1)

    def _factor_dtype(self, adapter: str) -> torch.dtype:
        return next(iter(self.lora_A[adapter].values())).weight.dtype

    def _adapting(self) -> list[str]:
        if self.disable_adapters or self.merged:
            return []
        return [name for name in self.active_adapters if name in self.lora_A]


class FusedPartsLinear(FusedParts):
    def forward(self, x: Tensor, *args, **kwargs) -> Tensor:
        result = self.base_layer(x, *args, **kwargs)  # (..., width)
        for adapter in self._adapting():
            # PEFT's cast, so that uncast_inputs (lora.py) reaches these layers too
            x_in = self.lora_dropout[adapter](
                self._cast_input_dtype(x, self._factor_dtype(adapter)))
            for part, (start, stop) in self.rows.items():
                update = self.lora_B[adapter][part](self.lora_A[adapter][part](x_in))
                # (..., stop - start) into its rows; the other rows are the base's output
                result[..., start:stop] += (update * self.scaling[adapter]).to(result.dtype)
        return result


class FusedPartsAttention(FusedParts):
    def forward(self, query: Tensor, *args, **kwargs) -> Tensor:
        base = self.get_base_layer()
        adapting = self._adapting()
        if not adapting:
            return base(query, *args, **kwargs)
        weight = base.in_proj_weight  # (3 * d, d)
        delta = torch.zeros_like(weight, dtype=self._factor_dtype(adapting[0]))
        for adapter in adapting:
            for part, (start, stop) in self.rows.items():
                delta[start:stop] += self.part_delta(adapter, part)
        return functional_call(base, {"in_proj_weight": weight + delta.to(weight.dtype)},
                               (query, *args), kwargs)


def custom_layers(rows_by_module: dict[int, Rows]) -> Callable[..., nn.Module | None]:
    """PEFT's custom-module hook: the memfit layer for ``target`` (a fused projection in
    ``rows_by_module``, keyed by ``id(module)``, or a Conv subclass), or None so that PEFT
    builds its own. A closure, not an object: PEFT may deep-copy its config."""
    def create(target: nn.Module, adapter_name: str, config, **kwargs) -> nn.Module | None:
        base = target.get_base_layer() if isinstance(target, LoraLayer) else target
        rows = rows_by_module.get(id(base))
        if rows is not None:
            layer = (FusedPartsAttention if isinstance(base, nn.MultiheadAttention)
                     else FusedPartsLinear)
            return layer(target, adapter_name, config, rows, **kwargs)
        if isinstance(base, _PLAIN_CONVS) and type(base) not in _PLAIN_CONVS:
            layer = (SubclassConv1d, SubclassConv2d, SubclassConv3d)[base.weight.dim() - 3]
            return layer(target, adapter_name, config=config, **kwargs)
        return None
    return create


def register(lora_config, rows_by_module: dict[int, Rows]) -> None:
    """Route Linear, Conv1D, Conv and MultiheadAttention targets of ``lora_config``
    through ``custom_layers`` first."""
    from transformers.pytorch_utils import Conv1D

    create = custom_layers(rows_by_module)
    lora_config._register_custom_module(
        dict.fromkeys((nn.Linear, Conv1D, nn.MultiheadAttention, *_PLAIN_CONVS), create))
