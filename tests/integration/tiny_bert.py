"""A tiny BERT folder and a learnable text-classification task, built in the test run.

The model is what a user would download, shrunk: a ``BertModel`` (hidden 32, 2 layers,
random weights, no classification head) saved with ``save_pretrained`` next to a
WordPiece tokenizer trained with ``tokenizers`` on the task's own text and saved as a
``BertTokenizerFast``. The task: a review is "positive" when it says "great" and
"negative" when it says "awful", among filler words.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

LABELS = ("negative", "positive")
_KEYWORDS = {"negative": "awful", "positive": "great"}
_FILLER = ("the a movie film plot actor story scene music ending was is felt very quite "
           "rather long short").split()


def review_rows(count: int, seed: int) -> list[dict[str, str]]:
    """``count`` rows {"text", "label"}, the labels alternating."""
    generator = random.Random(seed)
    rows = []
    for index in range(count):
        label = LABELS[index % 2]
        words = generator.choices(_FILLER, k=generator.randint(4, 10))
        words.insert(generator.randrange(len(words) + 1), _KEYWORDS[label])
        rows.append({"text": " ".join(words), "label": label})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_tiny_bert(folder: Path) -> Path:
    """``folder`` holding config.json, model.safetensors and the tokenizer files."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel, BertTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wordpiece.train_from_iterator(
        [row["text"] for row in review_rows(200, seed=0)],
        trainers.WordPieceTrainer(vocab_size=200, special_tokens=specials, show_progress=False))
    cls, sep = wordpiece.token_to_id("[CLS]"), wordpiece.token_to_id("[SEP]")
    wordpiece.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    BertTokenizerFast(tokenizer_object=wordpiece).save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=wordpiece.get_vocab_size(), hidden_size=32,
                        num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=128, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    BertModel(config).save_pretrained(folder)
    return folder
