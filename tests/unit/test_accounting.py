"""One accounting rule: the categories, their priority, and how a storage is classified.

The tracker (real CPU storages) and the planner's trace (fake storages) both call
``memfit.accounting``; the last test runs one micro-batch under each and asserts the same
bytes in every category, so the two can never classify the same situation differently.
"""

from __future__ import annotations

import contextlib
import gc

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from memfit import accounting
from memfit.accounting import LiveStorages
from memfit.monitor.tensor_tracker import TensorTracker
from memfit.plan.trace import trace_micro_batch

FP32 = 4


def test_categories_are_the_project_vocabulary_in_priority_order():
    assert accounting.CATEGORIES == ("weights", "grads", "optimizer", "activations", "temporaries")
    assert [accounting.WEIGHTS, accounting.GRADS, accounting.OPTIMIZER,
            accounting.ACTIVATIONS, accounting.TEMPORARIES] == list(range(5))
    assert accounting.SAVED_FOR_BACKWARD == accounting.ACTIVATIONS


def test_a_storage_moves_up_to_its_strongest_role_and_never_down():
    live = LiveStorages()
    weight = torch.zeros(10)
    record = live.count(weight.untyped_storage(), 10 * FP32, accounting.TEMPORARIES, born=0)
    # A weight saved for backward is a weight; it is not demoted by a weaker role after.
    assert live.promote(record, accounting.SAVED_FOR_BACKWARD)
    assert live.promote(record, accounting.WEIGHTS)
    assert not live.promote(record, accounting.GRADS)
    assert not live.promote(record, accounting.ACTIVATIONS)
    assert live.bytes == [10 * FP32, 0, 0, 0, 0] and live.total == 10 * FP32


def test_a_storage_is_subtracted_when_it_dies():
    live = LiveStorages()
    tensor = torch.zeros(10)
    live.count(tensor.untyped_storage(), 10 * FP32, accounting.ACTIVATIONS, born=0)
    view = tensor[2:]
    del tensor
    assert live.total == 10 * FP32  # the view keeps the storage alive
    del view
    gc.collect()
    assert live.total == 0 and live.bytes == [0] * len(accounting.CATEGORIES) and not live.records


def test_fresh_storages_are_activations_only_under_another_saved_tensors_hook():
    def own(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def other(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    assert accounting.fresh_category(own) == accounting.TEMPORARIES
    with torch.autograd.graph.saved_tensors_hooks(own, own):
        # our hook sees what is saved
        assert accounting.fresh_category(own) == accounting.TEMPORARIES
        with torch.autograd.graph.saved_tensors_hooks(other, other):
            # checkpoint / offload: what is saved is hidden from us
            assert accounting.fresh_category(own) == accounting.ACTIVATIONS
            with torch.no_grad():
                assert accounting.fresh_category(own) == accounting.TEMPORARIES


def test_weights_include_buffers_and_optimizer_state_excludes_parameters():
    model = nn.BatchNorm1d(4)
    assert {id(t) for t in accounting.weight_tensors(model)} == {
        id(t) for t in [*model.parameters(), *model.buffers()]}
    optimizer = torch.optim.AdamW(model.parameters(), lr=torch.tensor(0.1))
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    state = list(accounting.optimizer_state_tensors(optimizer))
    assert not {id(t) for t in state} & {id(p) for p in model.parameters()}
    # step, exp_avg, exp_avg_sq per parameter, and the tensor learning rate
    assert len(state) == 3 * 2 + 1


class Tiny(nn.Module):
    """Embedding, two MLP blocks (optionally checkpointed), norm, vocabulary head."""

    def __init__(self, checkpointed: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(16, 256), nn.GELU(), nn.Linear(256, 16)) for _ in range(2))
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 50)
        self.checkpointed = checkpointed

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)  # [batch, tokens, 16]
        for block in self.blocks:
            # Checkpointed, the first block's output is allocated under checkpoint's hooks
            # and kept (hidden from the counters) as the second block's input.
            hidden = checkpoint(block, hidden, use_reentrant=False) if self.checkpointed \
                else block(hidden)
        return self.head(self.norm(hidden))  # [batch, tokens, 50]


def _loss_sum(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(batch["ids"])
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), reduction="sum")


# Many tokens: activations dominate the peak (checkpointed: the recomputed block's, in
# backward). Few tokens through the weights: grads dominate it (end of backward).
@pytest.mark.parametrize("tokens", [(4, 12), (1, 2)], ids=["many-tokens", "few-tokens"])
@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("autocast", [None, torch.bfloat16], ids=["fp32", "bf16-autocast"])
def test_tracker_and_trace_split_one_micro_batch_identically(tokens, checkpointed, autocast):
    def make_batch() -> dict[str, torch.Tensor]:
        return {"ids": torch.zeros(tokens, dtype=torch.long),
                "labels": torch.zeros(tokens, dtype=torch.long)}

    model = Tiny(checkpointed)
    tracker = TensorTracker()
    tracker.attach(model)
    with tracker:
        batch = make_batch()
        with torch.autocast("cpu", dtype=autocast) if autocast else contextlib.nullcontext():
            loss = _loss_sum(model, batch)
        mean = loss / 2  # as training backpropagates the sum over the step's items
        mean.backward()
        del loss, mean, batch
    tracker.scan()  # the grads are recognised once they are .grad
    measured = tracker.peak_by_category()

    with torch.device("meta"):
        shape_only = Tiny(checkpointed)
    planned = trace_micro_batch(shape_only, make_batch, _loss_sum, autocast,
                                activation_offload=False).peak
    assert planned == measured
    assert (measured["activations"] > measured["grads"]) == (tokens == (4, 12)), measured
