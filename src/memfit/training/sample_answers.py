"""``data.sample_prompts``: the prompts the model answers at each evaluation, so that a run
shows what it writes, not only its loss.

Each prompt is laid out as data.format lays out a prompt (data/prompts.py), answered
greedily with at most ``data.sample_max_new_tokens`` new tokens (models/generation.py,
the decoding ``memfit generate`` uses), in eval mode and the run's autocast. One record
goes to metrics.jsonl, ``{"step": N, "sample_answers": [{"prompt": ..., "answer": ...},
...]}``, and one text to TensorBoard (``samples/answers``), which ``memfit report``
shows. Distributed, every rank answers (FSDP2's all-gathers need every rank in every
forward; greedy decoding writes the same tokens on each) and rank 0 logs.
"""

from __future__ import annotations

from typing import Any

from memfit.data.prompts import prompt_ids
from memfit.models.generation import Decoding, answer_text, generate_ids
from memfit.techniques.precision import autocast
from memfit.training.build import Run

SAMPLE_ANSWERS_KEY = "sample_answers"
TENSORBOARD_TAG = "samples/answers"


def answer_sample_prompts(run: Run, step: int, logger: Any) -> None:
    """Answer data.sample_prompts with ``run.model`` and log the answers at ``step``
    (nothing without sample prompts)."""
    data = run.config.data
    if not data.sample_prompts:
        return
    decoding = Decoding(max_new_tokens=data.sample_max_new_tokens)
    tokenizer = run.tokenizer
    run.model.eval()
    try:
        with autocast(run.config.precision, run.device):
            answers = [{"prompt": prompt,
                        "answer": answer_text(tokenizer, generate_ids(
                            run.model, tokenizer, prompt_ids(tokenizer, data.format, prompt),
                            decoding))}
                       for prompt in data.sample_prompts]
    finally:
        run.model.train()
    logger.log({"step": step, SAMPLE_ANSWERS_KEY: answers})
    logger.add_text(TENSORBOARD_TAG, as_markdown(answers), step)


def as_markdown(answers: list[dict[str, str]]) -> str:
    """The answers as TensorBoard renders text: a markdown list, the text in code spans so
    that a model's markup is shown as written."""
    def quoted(text: str) -> str:
        return "`" + " ".join(text.replace("`", "'").split()) + "`" if text.strip() else "(empty)"

    return "\n".join(f"- {quoted(item['prompt'])} → {quoted(item['answer'])}"
                     for item in answers)
