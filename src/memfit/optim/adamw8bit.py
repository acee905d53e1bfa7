"""bitsandbytes' 8-bit AdamW whose saved state is the plain fp32 moments.

bitsandbytes keeps each moment as uint8 codes with one fp32 absmax per block of 256
values; its state_dict saves those blocks, which are laid out along the flattened tensor
and cannot be divided among another number of processes. ``AdamW8bit.state_dict`` saves
``exp_avg`` / ``exp_avg_sq`` as fp32 tensors shaped like the parameter (dequantized), so a
checkpoint is resharded like AdamW's (torch.distributed.checkpoint divides them by rows)
and read by one process or many; ``load_state_dict`` quantizes them again.

Quantizing again must give back the same codes, so a resume on the same processes
continues bit for bit. bitsandbytes scales a block by its largest magnitude, which then
decodes to the codebook's extreme: +1.0, or -0.99297 for a negative peak of the signed
map, which has no -1.0. ``requantize`` therefore takes the scale as |peak| / |that code|,
not bitsandbytes' quantize_blockwise (which would take |peak| and shift every code of a
block with a negative peak). On another number of processes the blocks start elsewhere
and the moments are quantized afresh with the same rule.
"""

from __future__ import annotations

import bitsandbytes as bnb
import bitsandbytes.functional as F
import torch

_BLOCK = 256  # values per absmax scale of bitsandbytes' 8-bit optimizer state
_WRAPPED = bnb.optim.optimizer.Optimizer8bit._FSDP_WRAPPED_QUANT_STATE_KEY
# (bitsandbytes' state key, its codebook key, its scales key, the saved name, whether its
# codebook is signed)
_MOMENTS = (("state1", "qmap1", "absmax1", "exp_avg", True),
            ("state2", "qmap2", "absmax2", "exp_avg_sq", False))


def requantize(moment: torch.Tensor, code: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 codes (moment's shape) and fp32 scales (one per block of 256 values) of fp32
    values decoded from such codes, recovering them exactly (see the module docstring)."""
    flat = moment.reshape(-1)
    blocks = torch.nn.functional.pad(flat, (0, -flat.numel() % _BLOCK)).view(-1, _BLOCK)
    peak = blocks.gather(1, blocks.abs().argmax(dim=1, keepdim=True)).squeeze(1)  # (blocks,)
    extreme = torch.where(peak < 0, code.min(), code.max())
    scales = peak / extreme  # >= 0; 0 for an all-zero block
    scaled = blocks / torch.where(scales > 0, scales, 1.0).unsqueeze(1)
    ordered, order = code.sort()
    # The nearest code: of the two that surround each value in the sorted codebook.
    upper = torch.searchsorted(ordered, scaled.contiguous()).clamp_(1, len(ordered) - 1)
    nearer_lower = (scaled - ordered[upper - 1]) < (ordered[upper] - scaled)
    codes = order[upper - nearer_lower.long()].to(torch.uint8)
    return codes.view(-1)[:flat.numel()].view(moment.shape), scales


class AdamW8bit(bnb.optim.AdamW8bit):
    """``bnb.optim.AdamW8bit`` saving and loading fp32 moments (see the module docstring)."""

    def state_dict(self) -> dict:
        saved = super().state_dict()
        for entries in saved["state"].values():
            quantized = {**entries.pop(_WRAPPED, {})}
            for codes, codebook, scales, name, _ in _MOMENTS:
                moment = quantized[codes]
                if moment.dtype == torch.uint8:  # tensors under min_8bit_size stay fp32
                    moment = F.dequantize_blockwise(
                        moment, absmax=quantized[scales], code=quantized[codebook],
                        blocksize=_BLOCK).view(moment.shape)
                entries[name] = moment
        return saved

    def load_state_dict(self, state_dict: dict, move_to_device: bool = True) -> None:
        params = [p for group in self.param_groups for p in group["params"]]
        indices = [i for group in state_dict["param_groups"] for i in group["params"]]
        by_index = dict(zip(indices, params, strict=True))
        state = {}
        for index, entries in state_dict["state"].items():
            if "exp_avg" not in entries:  # bitsandbytes' own layout (an older checkpoint)
                state[index] = entries
                continue
            param = by_index[index]
            quantized = {}
            eight_bit = param.numel() >= self.args.min_8bit_size
            for codes, codebook, scales, name, signed in _MOMENTS:
                moment = entries[name].to(param.device, torch.float32)
                if eight_bit:
                    code = F.create_dynamic_map(signed=signed).to(param.device)
                    moment, quantized[scales] = requantize(moment, code)
                    quantized[codebook] = code
                quantized[codes] = moment.view(param.shape)
            state[index] = {**{k: v for k, v in entries.items()
                               if k not in ("exp_avg", "exp_avg_sq")}, _WRAPPED: quantized}
        super().load_state_dict({**state_dict, "state": state}, move_to_device)
