"""The causal-LM loss as a SUM over label tokens, shared by training and the planner
(which traces it on fake tensors to count the logits' memory)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100  # label positions excluded from the loss (prompt, padding)


def causal_lm_loss_sum(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    """Summed next-token cross-entropy over label positions that are not -100."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    # logits: [batch, seq, vocab]; position t predicts token t+1; fp32 for the loss.
    shifted_logits = logits[:, :-1].float()
    shifted_labels = batch["labels"][:, 1:]
    return F.cross_entropy(shifted_logits.reshape(-1, shifted_logits.size(-1)),
                           shifted_labels.reshape(-1), ignore_index=IGNORE_INDEX,
                           reduction="sum")


def reconstruction_loss_sum(reconstruction: torch.Tensor, target: torch.Tensor, kind: str
                            ) -> torch.Tensor:
    """Autoencoders: the per-image mean ``kind`` ("mse" or "l1") error, summed over the
    batch; reconstruction and target are (B, C, H, W)."""
    loss = F.mse_loss if kind == "mse" else F.l1_loss
    return loss(reconstruction.float(), target.float(), reduction="sum") / target[0].numel()
