"""Build the demo assets that ``memfit train`` fine-tunes when given no arguments.

From ``src/memfit/demo/assets/corpus.txt`` (Aesop's Fables, public domain) this script

1. trains a byte-level BPE tokenizer on the corpus,
2. writes ``instructions.jsonl``: question/answer rows about the fables (which fable a
   sentence is from, a fable's moral, its opening, the sentence after a given one),
3. pretrains a small Llama model on the corpus text only (causal LM, AdamW, warmup then
   cosine decay), so the instruction format is new to it but the facts are not,
4. writes ``base/`` (model, generation config, tokenizer) through a temporary folder.

Everything is seeded and runs on one CPU thread, so a rerun reproduces the same files:

    HF_HUB_OFFLINE=1 python scripts/pretrain_demo_base.py
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path

import tokenizers
import torch
from tokenizers import decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from memfit._utils.atomic import staged_folder, write_text
from memfit.demo import demo_assets_dir
from memfit.models.tokenizers import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    as_transformers_tokenizer,
)

SEED = 1867
VOCAB_SIZE = 1024
MAX_POSITIONS = 512
# Rows longer than this (chat template included) are left out of instructions.jsonl, so
# the demo can fine-tune at sequence length 128 without truncating any answer.
MAX_ROW_TOKENS = 128


@dataclass(frozen=True)
class PretrainSettings:
    steps: int = 800
    batch_size: int = 16
    sequence_length: int = 128
    peak_lr: float = 3e-3
    final_lr_fraction: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0


@dataclass(frozen=True)
class Fable:
    title: str
    sentences: tuple[str, ...]
    moral: str | None

    def text(self) -> str:
        """The fable as it appears in the corpus: title, body and moral paragraphs."""
        paragraphs = [self.title, " ".join(self.sentences)]
        if self.moral is not None:
            paragraphs.append(self.moral)
        return "\n\n".join(paragraphs)


# A sentence may end at . ! or ?, possibly followed by a closing quote, where a capital
# or an opening quote comes next.
_SENTENCE_END = re.compile(r'(?:(?<=[.!?])|(?<=[.!?]"))\s+(?=["A-Z])')


def split_sentences(paragraph: str) -> tuple[str, ...]:
    """Split at sentence ends outside quotations, so that a speech such as
    "Wolf! Wolf!" stays inside the sentence that quotes it."""
    sentences, start = [], 0
    for boundary in _SENTENCE_END.finditer(paragraph):
        if paragraph.count('"', 0, boundary.start()) % 2 == 0:
            sentences.append(paragraph[start:boundary.start()])
            start = boundary.end()
    sentences.append(paragraph[start:])
    return tuple(sentences)


def read_fables(corpus: str) -> list[Fable]:
    """Parse corpus.txt: '#' header lines, then fables separated by two blank lines,
    each 'title, blank line, body, and optionally blank line, moral'."""
    body = "\n".join(line for line in corpus.splitlines() if not line.startswith("#"))
    fables = []
    for block in body.strip().split("\n\n\n"):
        paragraphs = [paragraph.strip() for paragraph in block.strip().split("\n\n")]
        if len(paragraphs) not in (2, 3):
            raise ValueError(f"fable block must be title, body[, moral]: {block[:60]!r}")
        sentences = split_sentences(paragraphs[1])
        moral = paragraphs[2] if len(paragraphs) == 3 else None
        fables.append(Fable(title=paragraphs[0], sentences=sentences, moral=moral))
    return fables


def train_tokenizer(texts: list[str]) -> tokenizers.Tokenizer:
    """Byte-level BPE: any UTF-8 text encodes, and ids 0-2 are the special tokens."""
    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    return backend


def _quoted(sentence: str) -> str:
    # Sentences that are themselves quotations would otherwise render as ""...""
    return sentence if sentence.startswith('"') else f'"{sentence}"'


def build_instructions(fables: list[Fable], tokenizer: PreTrainedTokenizerFast,
                       rng: random.Random) -> list[dict[str, str]]:
    """Question/answer rows whose answers are corpus text the prompt does not contain."""
    rows = []
    for fable in fables:
        title = fable.title
        if fable.moral is not None:
            rows.append({"prompt": f'What is the moral of "{title}"?', "response": fable.moral})
        rows.append({"prompt": f'How does "{title}" begin?', "response": fable.sentences[0]})
        for index, sentence in enumerate(fable.sentences):
            if len(sentence) >= 30:
                rows.append({"prompt": f"Which fable contains this sentence? {_quoted(sentence)}",
                             "response": title})
            if index + 1 < len(fable.sentences):
                rows.append({
                    "prompt": f'In "{title}", which sentence comes after this one? '
                              f"{_quoted(sentence)}",
                    "response": fable.sentences[index + 1],
                })

    def row_tokens(row: dict[str, str]) -> int:
        conversation = [{"role": "user", "content": row["prompt"]},
                        {"role": "assistant", "content": row["response"]}]
        return len(tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=True)
                   ["input_ids"])

    # A row whose prompt quotes its own answer ("The North Wind and the Sun disputed...")
    # teaches nothing but copying.
    fitting = [row for row in rows
               if row["response"] not in row["prompt"] and row_tokens(row) <= MAX_ROW_TOKENS]
    # Shuffled so that any contiguous or random eval split mixes all four tasks.
    rng.shuffle(fitting)
    return fitting


def build_model() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )
    return LlamaForCausalLM(config)


def learning_rate(step: int, settings: PretrainSettings) -> float:
    """Linear warmup to peak_lr, then cosine decay to peak_lr * final_lr_fraction."""
    if step < settings.warmup_steps:
        return settings.peak_lr * (step + 1) / settings.warmup_steps
    progress = (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps)
    floor = settings.final_lr_fraction
    return settings.peak_lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def corpus_loss(model: LlamaForCausalLM, stream: torch.Tensor, sequence_length: int) -> float:
    """Mean next-token loss over the whole stream cut into consecutive windows."""
    usable = (len(stream) - 1) // sequence_length * sequence_length
    inputs = stream[:usable].view(-1, sequence_length)  # (windows, sequence_length)
    targets = stream[1:usable + 1].view(-1, sequence_length)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=inputs).logits  # (windows, sequence_length, vocab)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    model.train()
    return loss.item()


def pretrain(model: LlamaForCausalLM, stream: torch.Tensor, settings: PretrainSettings,
             generator: torch.Generator) -> float:
    """Train on random windows of the token stream; returns the mean of the last 50 losses."""
    decay, no_decay = [], []
    for parameter in model.parameters():
        # Norm gains are scales around 1; decaying them toward 0 only hurts.
        (no_decay if parameter.ndim < 2 else decay).append(parameter)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.peak_lr, betas=(0.9, 0.95),
    )
    window = settings.sequence_length + 1
    recent: list[float] = []
    start = time.perf_counter()
    for step in range(settings.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, settings)
        offsets = torch.randint(0, len(stream) - window + 1, (settings.batch_size,),
                                generator=generator)
        batch = torch.stack([stream[offset:offset + window] for offset in offsets])
        # labels == input_ids: the model shifts them by one position internally.
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        recent = (recent + [loss.item()])[-50:]
        if step % 100 == 0 or step == settings.steps - 1:
            print(f"step {step:5d}  loss {loss.item():.3f}  lr {learning_rate(step, settings):.2e}"
                  f"  {time.perf_counter() - start:6.1f}s", flush=True)
    return sum(recent) / len(recent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=PretrainSettings.steps,
                        help="pretraining optimizer steps (default %(default)s)")
    parser.add_argument("--assets", type=Path, default=demo_assets_dir(),
                        help="folder holding corpus.txt; outputs are written beside it")
    args = parser.parse_args()
    settings = PretrainSettings(steps=args.steps)

    # One thread makes the float arithmetic, and so the weights, reproducible.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    started = time.perf_counter()

    fables = read_fables((args.assets / "corpus.txt").read_text(encoding="utf-8"))
    documents = [fable.text() for fable in fables]
    backend = train_tokenizer(documents)
    tokenizer = as_transformers_tokenizer(backend, MAX_POSITIONS)

    rows = build_instructions(fables, tokenizer, random.Random(SEED))
    instructions = args.assets / "instructions.jsonl"
    write_text(instructions, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    instructions.chmod(0o644)  # the temporary file it was renamed from is private
    print(f"{len(fables)} fables, {len(rows)} instruction rows", flush=True)

    # Every fable is one document: <s> text </s>, concatenated into one stream. The
    # backend encodes without the wrapper's warning about documents over 512 tokens.
    stream = torch.tensor([token for document in documents
                           for token in [BOS_ID, *backend.encode(document).ids, EOS_ID]])
    print(f"corpus: {len(stream)} tokens, vocabulary {len(tokenizer)}", flush=True)

    model = build_model()
    parameters = sum(parameter.numel() for parameter in model.parameters())
    print(f"model: {parameters / 1e6:.2f}M parameters "
          f"(log vocab = {math.log(VOCAB_SIZE):.2f} nats at random)", flush=True)
    generator = torch.Generator().manual_seed(SEED)
    final_train_loss = pretrain(model, stream, settings, generator)
    final_corpus_loss = corpus_loss(model, stream, settings.sequence_length)

    with staged_folder(args.assets / "base") as staging:
        model.save_pretrained(staging)
        GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
                         max_new_tokens=64).save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        # mkdtemp and the safetensors writer make private files; ship them readable.
        staging.chmod(0o755)
        for path in staging.iterdir():
            path.chmod(0o644)

    print(f"final pretraining loss {final_train_loss:.3f} (mean of last 50 steps), "
          f"whole-corpus loss {final_corpus_loss:.3f}, "
          f"{time.perf_counter() - started:.0f}s in all", flush=True)


if __name__ == "__main__":
    main()
