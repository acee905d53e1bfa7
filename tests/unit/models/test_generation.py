"""Greedy generation is the most likely token at each step until an end token, whatever
sampling settings the model folder's generation config holds (oracle: a plain loop of
forwards and argmax)."""

from __future__ import annotations

import torch

from memfit.config.schema import ModelConfig
from memfit.models.generation import Decoding, end_token_ids, generate_ids
from memfit.models.load import load_model


def greedy_reference(model, prompt: list[int], new_tokens: int, ends: list[int]) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = model(torch.tensor([ids])).logits  # (1, len, vocab)
            ids.append(int(logits[0, -1].argmax()))
            if ids[-1] in ends:
                break
    return ids[len(prompt):]


def test_greedy_is_argmax_even_when_the_folder_says_sample():
    torch.manual_seed(0)
    loaded = load_model(ModelConfig(preset="tiny-llama"))
    model, tokenizer = loaded.model.eval(), loaded.tokenizer
    model.generation_config.do_sample = True  # as an instruct model's folder may say
    model.generation_config.temperature = 0.3
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, 7]
    assert end_token_ids(model, tokenizer) == [tokenizer.eos_token_id, 7]
    prompt = tokenizer("hello", add_special_tokens=False)["input_ids"]
    written = generate_ids(model, tokenizer, prompt, Decoding(max_new_tokens=10))
    assert written == greedy_reference(model, prompt, 10, [tokenizer.eos_token_id, 7])
    assert len(written) > 0


def test_sampling_repeats_with_its_seed_and_differs_from_greedy():
    torch.manual_seed(0)
    loaded = load_model(ModelConfig(preset="tiny-llama"))
    model, tokenizer = loaded.model.eval(), loaded.tokenizer
    prompt = tokenizer("hello", add_special_tokens=False)["input_ids"]
    sampled = Decoding(max_new_tokens=16, temperature=2.0, top_p=1.0, seed=3)
    first = generate_ids(model, tokenizer, prompt, sampled)
    assert generate_ids(model, tokenizer, prompt, sampled) == first
    assert first != generate_ids(model, tokenizer, prompt, Decoding(max_new_tokens=16))
