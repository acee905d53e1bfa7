"""optimizer.name=adamw8bit and paged_adamw8bit: bitsandbytes' 8-bit AdamW (adamw8bit
through memfit.optim.AdamW8bit, whose checkpoints hold fp32 moments that reshard).

State: two uint8 moments and one fp32 absmax per 256 values each; tensors under 4096
values keep fp32 moments (REFERENCE.md). Scratch: the dequantized fp32 moments and the
update of one parameter.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from memfit._utils.errors import ConfigError
from memfit.techniques.optimizers.adamw import ADAM_OPTIONS
from memfit.techniques.optimizers.options import adam_options
from memfit.techniques.optimizers.setting import OptimizerSetting
from memfit.techniques.optimizers.spec import (
    Factory,
    OptimizerSpec,
    Param,
    ParamCost,
)
from memfit.techniques.optimizers.step_work import ADAMW8BIT, streaming

# bitsandbytes 8-bit optimizers keep fp32 state for tensors smaller than this.
BNB_MIN_8BIT_SIZE = 4096
QUANT_BLOCK = 256  # values per absmax scale
CODE_BOOK_BYTES = 2 * 256 * 4  # bitsandbytes' dynamic maps of both moments, per optimizer


def _paged_refusal(setting: OptimizerSetting) -> str:
    return ("optimizer.name=paged_adamw8bit: its state is paged between GPU and host memory "
            "by CUDA, which FSDP2's sharded parameters do not go through; use "
            "optimizer.name=adamw8bit")


def _factory(paged: bool):
    def make(setting: OptimizerSetting) -> Factory:
        if paged and not torch.cuda.is_available():
            raise ConfigError("optimizer.name=paged_adamw8bit needs CUDA (it pages GPU "
                              "memory to the host); use adamw8bit on this machine")
        if paged:
            import bitsandbytes as bnb

            options = adam_options(setting.optimizer, ADAM_OPTIONS)
            return lambda groups: bnb.optim.PagedAdamW8bit(groups, **options)
        from memfit.optim.adamw8bit import AdamW8bit

        return lambda groups: AdamW8bit(groups, **adam_options(setting.optimizer, ADAM_OPTIONS))

    return make


def _cost(param: Param) -> ParamCost:
    numel = param.numel
    small = numel < BNB_MIN_8BIT_SIZE
    state = 8 * numel if small else 2 * numel + 2 * 4 * -(-numel // QUANT_BLOCK)
    return ParamCost(state, 3 * 4 * numel, param.nbytes)


def _costs(params: list[Param], setting: OptimizerSetting) -> list[ParamCost]:
    """Each parameter's _cost; and the two code books (256 fp32 values each, signed for the
    first moment, unsigned for the second) one optimizer keeps once its first quantized
    state exists, counted with that parameter's state."""
    costs = [_cost(param) for param in params]
    first = next((i for i, p in enumerate(params) if p.numel >= BNB_MIN_8BIT_SIZE), None)
    if first is not None:
        costs[first] = replace(costs[first], state=costs[first].state + CODE_BOOK_BYTES)
    return costs


# Under FSDP2 each process quantizes its own rows (bitsandbytes' kernels take plain
# tensors): its blocks of 256 start at its first row, not at the whole tensor's.
SPEC = OptimizerSpec(
    name="adamw8bit",
    docs_row=("`bitsandbytes.optim.AdamW8bit` (block-wise 8-bit moments; tensors under 4096 "
              "values keep fp32 moments)", "~2 bytes"),
    options=ADAM_OPTIONS, factory=_factory(paged=False), costs=_costs,
    step_work=streaming(ADAMW8BIT), plan_methods=(("full-adamw8bit", {}),),
    steps_local_rows=True)
PAGED_SPEC = OptimizerSpec(
    name="paged_adamw8bit",
    docs_row=("`bitsandbytes.optim.PagedAdamW8bit`; needs CUDA (a clear error on CPU)",
              "~2 bytes, paged to host under pressure"),
    options=ADAM_OPTIONS, factory=_factory(paged=True), costs=_costs,
    step_work=streaming(ADAMW8BIT),
    fsdp_refusal=_paged_refusal,
    bench=())  # CUDA only: the CPU benchmark cannot run it
