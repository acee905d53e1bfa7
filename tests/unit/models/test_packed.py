"""Packed rows against the same rows padded: the loss sum, its token count and every
gradient agree (the oracle is the unpacked batch, which has no way to leak across rows)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from memfit.data import IGNORE_INDEX, collate, count_loss_tokens
from memfit.data.tokens import TokenDataset, pack_rows
from memfit.models.loss import causal_lm_loss_sum
from memfit.models.packed import causal_lm_inputs, flattened
from memfit.models.presets import tiny_llama
from memfit.techniques import chunked_loss

MAX_LENGTH = 24
LENGTHS = (9, 15, 5, 20, 7, 3, 11)  # first fit: [9 15] [5 7 3] [20] [11]
PROMPTS = (4, 6, 2, 10, 3, 1, 5)  # leading tokens of each row masked out of the loss


def rows() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    input_ids, labels = [], []
    for length, prompt in zip(LENGTHS, PROMPTS, strict=True):
        ids = torch.randint(3, 250, (length,), generator=generator)
        input_ids.append(ids)
        labels.append(torch.cat([torch.full((prompt,), IGNORE_INDEX), ids[prompt:]]))
    return input_ids, labels


def padded_and_packed() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    input_ids, labels = rows()
    unpacked = TokenDataset(input_ids, labels)
    packed = pack_rows(input_ids, labels, MAX_LENGTH)
    return (collate([unpacked[i] for i in range(len(unpacked))], pad_token_id=0),
            collate([packed[i] for i in range(len(packed))], pad_token_id=0))


def model(attention: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_llama(), attn_implementation=attention,
                                            dtype=torch.float32)


def loss_and_grads(network: torch.nn.Module, loss_sum, batch) -> tuple[torch.Tensor, list]:
    network.zero_grad()
    loss = loss_sum(network, batch)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in network.parameters()]


def assert_same(network, loss_sum, padded, packed) -> None:
    expected, expected_grads = loss_and_grads(network, loss_sum, padded)
    got, grads = loss_and_grads(network, loss_sum, packed)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-6)


def test_rows_are_packed_first_fit_with_their_own_positions():
    padded, packed = padded_and_packed()
    # 9+15 | 5+7+3 | 20 | 11: the 7 and the 3 go back to the second block, which has room
    assert packed["input_ids"].shape == (4, MAX_LENGTH) and padded["input_ids"].shape == (7, 20)
    assert packed["position_ids"][0].tolist() == list(range(9)) + list(range(15))
    assert packed["position_ids"][1].tolist() == [*range(5), *range(7), *range(3), *[0] * 9]
    # Each row's first token is learned by no one: nothing predicts across a join.
    starts = packed["position_ids"] == 0
    assert (packed["labels"][starts] == IGNORE_INDEX).all()
    assert count_loss_tokens(packed) == count_loss_tokens(padded)
    assert int(packed["attention_mask"].sum()) == sum(LENGTHS)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_loss_and_gradients_equal_the_padded_ones(attention):
    padded, packed = padded_and_packed()
    network = model(attention)
    assert causal_lm_inputs(network, packed)[0]["attention_mask"] is None  # transformers masks
    assert_same(network, causal_lm_loss_sum, padded, packed)


def test_the_chunked_loss_packs_the_same_way():
    padded, packed = padded_and_packed()
    assert_same(model("sdpa"), lambda m, b: chunked_loss.causal_lm_loss_sum(m, b, 8),
                padded, packed)


def test_the_flattened_row_flash_attention_gets_equals_the_padded_batch():
    """Flash attention sees the micro-batch as one [1, tokens] row (models/packed.py); its
    kernel cannot run here, but the row is a valid packed input for sdpa too, which reads
    the same position-id restarts."""
    padded, packed = padded_and_packed()

    def flat_loss_sum(network, batch):
        if "position_ids" not in batch:
            return causal_lm_loss_sum(network, batch)
        inputs, labels = flattened(batch)
        assert inputs["input_ids"].shape == (1, sum(LENGTHS))
        logits = network(**inputs).logits[:, :-1].float()
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1),
                               ignore_index=IGNORE_INDEX, reduction="sum")

    assert_same(model("sdpa"), flat_loss_sum, padded, packed)


def test_without_position_ids_the_rows_would_see_each_other():
    """The oracle can fail: the same blocks with the default positions and mask differ."""
    padded, packed = padded_and_packed()
    network = model("sdpa")
    leaking = {name: value for name, value in packed.items() if name != "position_ids"}
    expected, _ = loss_and_grads(network, causal_lm_loss_sum, padded)
    got, _ = loss_and_grads(network, causal_lm_loss_sum, leaking)
    assert not torch.allclose(got, expected, rtol=1e-3)
