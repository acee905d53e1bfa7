"""Chunked LM loss: the same summed loss and the same gradients as the plain computation
(oracle: cross_entropy over the full logits), while no tensor of the full
batch x seq x vocab logits size is ever allocated."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM

from memfit._utils.errors import ConfigError
from memfit.models.presets import tiny_llama
from memfit.techniques import chunked_loss
from memfit.training.objective import Objective


class LargestAllocation(TorchDispatchMode):
    """Records the largest tensor any op returns (bytes)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.nelement() * tensor.element_size())
        return out


def plain_loss_sum(hidden, labels, head):
    logits = head(hidden)[:, :-1].float()  # [batch, seq - 1, vocab]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1),
                           ignore_index=-100, reduction="sum")


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_same_loss_and_gradients_as_the_full_logits(chunk):
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, dtype=torch.float64)
    hidden = torch.randn(3, 12, 16, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 50, (3, 12))
    labels[0, :4] = -100  # a masked prompt
    labels[2, 9:] = -100  # padding
    expected = plain_loss_sum(hidden, labels, head)
    expected_grads = torch.autograd.grad(expected, [hidden, head.weight, head.bias])
    actual = chunked_loss.loss_sum(hidden, labels, head, chunk)
    actual_grads = torch.autograd.grad(actual, [hidden, head.weight, head.bias])
    torch.testing.assert_close(actual, expected)
    for got, want in zip(actual_grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)


def test_no_label_gives_a_zero_that_backpropagates():
    hidden = torch.randn(1, 4, 8, requires_grad=True)
    loss = chunked_loss.loss_sum(hidden, torch.full((1, 4), -100), torch.nn.Linear(8, 5), 2)
    loss.backward()
    assert loss.item() == 0 and torch.count_nonzero(hidden.grad) == 0


def test_objective_on_a_llama_matches_and_never_holds_the_full_logits():
    torch.manual_seed(0)
    config = tiny_llama()
    config.vocab_size = 1024  # logits larger than any other tensor, as in real LMs
    model = AutoModelForCausalLM.from_config(config)
    chunked_loss.check_supported(model)
    batch = {"input_ids": torch.randint(3, 1024, (2, 128)),
             "attention_mask": torch.ones(2, 48, dtype=torch.long)}
    batch["labels"] = batch["input_ids"].clone()
    full_logits_bytes = 2 * 128 * model.config.vocab_size * 4

    def loss_and_grads(objective):
        model.zero_grad()
        tracker = LargestAllocation()
        with tracker:
            loss = objective.loss_sum(model, batch)
            loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()], tracker.largest

    plain, plain_grads, plain_largest = loss_and_grads(Objective(causal_lm=True))
    chunked, chunked_grads, chunked_largest = loss_and_grads(
        Objective(causal_lm=True, loss_chunk_tokens=16))
    torch.testing.assert_close(chunked, plain)
    for got, want in zip(chunked_grads, plain_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert plain_largest >= full_logits_bytes
    assert chunked_largest <= full_logits_bytes / 4  # the embedding gradient, here


def test_models_that_rescale_logits_are_refused():
    config = tiny_llama()
    config.final_logit_softcapping = 30.0
    with pytest.raises(ConfigError, match="final_logit_softcapping"):
        chunked_loss.check_supported(AutoModelForCausalLM.from_config(config))
    with pytest.raises(ConfigError, match="needs a transformers causal LM"):
        chunked_loss.check_supported(torch.nn.Linear(2, 2))
