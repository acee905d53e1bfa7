"""``memfit predict RUN FILE [--output OUT.jsonl]``: a trained classifier's prediction for
each row (or image) of FILE.

The run's result is loaded as ``memfit generate`` loads it (training/trained_model.py:
adapters merged into the rebuilt base, or the full fine-tune's ``model/``), from a run
folder treated as untrusted (memfit's marker, ``--trust-code`` for code its config names,
no link out of it). Each row of FILE becomes the model's input exactly as a training row
did (per model.task, ``_READERS``; model.task=sequence-classification: the text in the
run's data.text_field, tokenized as data/classification.py tokenizes it, jsonl/csv/parquet
as ``data.path`` takes them; rows need no label). The output is JSON lines, one per row in
FILE's order: ``{"row": 0, "label": "positive", "probability": 0.93}`` with ``row`` the
row's index in FILE (from 0), ``label`` the most likely class's name (model.labels, as
the run saved them) and ``probability`` its softmax probability.
model.task=image-classification: FILE is an image or array file or a folder of them (read
as data.format=images reads data.path, sorted), each image made the model's input as
training made its images (data.images); each record also names its ``file`` (an array
file's image as ``FILE[name] #i``): ``{"row": 0, "file": "new/1.png", "label": "cat",
"probability": 0.97}``. Without ``--output``
the lines go to stdout; an ``--output`` file is written atomically (temporary name, then
rename), and an existing one is replaced only when it is empty or holds predictions.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memfit._utils.atomic import write_text
from memfit._utils.errors import ConfigError
from memfit._utils.no_follow import FILE, check_entry
from memfit.config import Config
from memfit.config.code_trust import refuse_untrusted_code
from memfit.config.schema import Task
from memfit.data import collate
from memfit.data.classification import text_ids
from memfit.data.images import files_images, image_files, load_images, transformed
from memfit.data.read import data_files, iter_rows, read_rows
from memfit.models.loss import image_classification_logits
from memfit.training.trained_model import run_config, trained_model

COMMAND = "memfit predict"
RECORD_KEYS = ("row", "label", "probability")
IMAGE_RECORD_KEYS = ("row", "file", "label", "probability")

# Batches of model inputs: (the rows' indices in FILE, the batch's tensors, and for images
# where each one is: its file, or an array file's name and index).
Batches = Iterator[tuple[list[int], dict[str, torch.Tensor], list[str] | None]]


def _text_batches(config: Config, tokenizer: Any, file: Path) -> Batches:
    """FILE's texts (data.text_field), tokenized as training tokenized them, padded."""
    key = f"{COMMAND} FILE"
    files = data_files(str(file), key)
    sources = read_rows(files, config.data.text_field)
    count = sum(len(source.table) for source in sources)
    size = config.train.micro_batch_size
    rows_done = 0
    for rows in iter_rows(sources, range(count)):
        for start in range(0, len(rows), size):
            chunk = rows[start:start + size]
            ids = text_ids(chunk, tokenizer, config.data.text_field, config.data.max_length)
            batch = collate([{"input_ids": x, "attention_mask": torch.ones_like(x)} for x in ids],
                            pad_token_id=tokenizer.pad_token_id)
            yield list(range(rows_done, rows_done + len(chunk))), batch, None
            rows_done += len(chunk)


def _image_batches(config: Config, tokenizer: Any, file: Path) -> Batches:
    """FILE (an image or array file, or a folder of them, as data/images.py reads one) as
    training made its images: data.images' normalize, channels, size and contrast."""
    settings = config.data.images
    pairs = list(files_images(image_files(str(file), f"{COMMAND} FILE"), settings.channels))
    size = config.train.micro_batch_size
    for start in range(0, len(pairs), size):
        chunk = pairs[start:start + size]
        images = transformed(load_images(chunk, settings), settings, config.train.seed,
                             targets=False)["images"]
        # Noise is seeded per image index: the index in FILE, as in a training split.
        yield (list(range(start, start + len(chunk))), {"images": images},
               [where for where, _ in chunk])


# model.task -> how FILE's rows become model inputs.
_READERS: dict[Task, Callable[[Config, Any, Path], Batches]] = {
    Task.SEQUENCE_CLASSIFICATION: _text_batches,
    Task.IMAGE_CLASSIFICATION: _image_batches,
}


def predictions(run_dir: str | Path, file: str | Path, trust_code: bool = False
                ) -> Iterator[dict[str, Any]]:
    """One record per row of ``file``, in order, as the run's classifier predicts it.
    Every refusal about the run comes before the model is loaded."""
    run_dir, file = Path(run_dir), Path(file)
    config = run_config(run_dir, COMMAND)
    refuse_untrusted_code(config, f"{COMMAND} {run_dir}: its config.yaml", trust_code)
    task = config.model.task
    if task not in _READERS:
        use = " (use memfit generate for a language model)" if task is Task.CAUSAL_LM else ""
        raise ConfigError(f"{COMMAND} {run_dir}: the run trained model.task={task}; memfit "
                          f"predict answers with classifiers (model.task="
                          f"{', '.join(t.value for t in _READERS)}){use}")
    if not file.exists():
        raise ConfigError(f"{COMMAND} FILE {file} does not exist")
    labels = config.model.labels
    model, tokenizer, _ = trained_model(run_dir, config, COMMAND)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = model.to(device).eval()
    pixel_values = config.model.path is not None
    with torch.inference_mode():
        for rows, batch, places in _READERS[task](config, tokenizer, file):
            batch = {name: value.to(device) for name, value in batch.items()}
            logits = (image_classification_logits(model, batch["images"], pixel_values)
                      if task is Task.IMAGE_CLASSIFICATION else _logits(model, batch))
            probabilities = torch.softmax(logits.float(), dim=-1)  # (batch, classes)
            best, classes = probabilities.max(dim=-1)
            for index, (row, probability, class_id) in enumerate(
                    zip(rows, best.tolist(), classes.tolist(), strict=True)):
                name = labels[class_id] if class_id < len(labels) else str(class_id)
                yield ({"row": row, "label": name, "probability": probability} if places is None
                       else {"row": row, "file": places[index], "label": name,
                             "probability": probability})


def _logits(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """(batch, classes): a transformers output's ``logits``, or the module's own tensor."""
    output = model(**inputs)
    return output if isinstance(output, torch.Tensor) else output.logits


def write_predictions(run_dir: str | Path, file: str | Path, output: str | Path,
                      trust_code: bool = False) -> int:
    """``predictions`` written to ``output`` as JSON lines; returns how many rows."""
    output = Path(output)
    _check_output(Path(run_dir), Path(file), output)
    lines = [json.dumps(record) + "\n" for record in predictions(run_dir, file, trust_code)]
    write_text(output, "".join(lines))
    return len(lines)


def _check_output(run_dir: Path, file: Path, output: Path) -> None:
    """Never the input, a file inside the run folder, a link, or a user's other file."""
    key = f"{COMMAND} --output {output}"
    target = output.resolve()
    if file.exists() and target == file.resolve():
        raise ConfigError(f"{key}: that is FILE itself; choose another file")
    if target.is_relative_to(run_dir.resolve()):
        raise ConfigError(f"{key}: that is inside the run folder {run_dir}; choose a file "
                          "outside it")
    try:
        exists = check_entry(output, FILE)
    except ConfigError as error:
        raise ConfigError(f"{key}: {error}") from None
    if exists and not _holds_predictions(output):
        raise ConfigError(f"{key}: that file exists and holds no predictions; choose a new "
                          "file name")
    if not output.parent.is_dir():
        raise ConfigError(f"{key}: the folder {output.parent} does not exist")


def _holds_predictions(path: Path) -> bool:
    """Empty, or a first line that is a prediction record this command writes."""
    with path.open("rb") as handle:
        first = handle.readline(4096)
    if not first.strip():
        return True
    try:
        record = json.loads(first)
    except ValueError:
        return False
    return isinstance(record, dict) and tuple(record) in (RECORD_KEYS, IMAGE_RECORD_KEYS)
