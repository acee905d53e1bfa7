"""``memfit generate PATH --prompt TEXT``: a trained language model answers a prompt.

PATH is a run folder of ``memfit train`` (its result: adapters merged into the rebuilt
base in memory, or the full fine-tune's ``model/``; training/trained_model.py) or a model
folder (``memfit merge --out``'s, or any local Hugging Face causal LM, or a GGUF file as
model.path takes one). The prompt is laid
out as the run's data.format lays out a prompt (data/prompts.py: chat -> the tokenizer's
chat template, instruction -> ``prompt\\n``, text -> continued as it is); a model folder
has no data.format, so it gets the chat template when its tokenizer has one, else plain
text. ``--format`` chooses instead. Decoding is greedy unless ``--temperature`` is above 0
(models/generation.py); each piece of text is handed to ``on_text`` as it is decoded.

A run folder is treated as untrusted, as ``memfit merge`` treats it: it must carry
memfit's marker, code its config names is imported only with ``--trust-code``, and what
is read of its result must lie inside it (no link out). A model folder's own code
(``auto_map``) is never run: transformers refuses it without ``trust_remote_code``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memfit._utils.errors import ConfigError
from memfit.config.choices import CLASSIFYING_TASKS
from memfit.config.code_trust import refuse_untrusted_code
from memfit.config.limits import MAX_TOKENS
from memfit.config.schema import DataFormat, ModelConfig, Task
from memfit.data.prompts import PROMPT_FORMATS, prompt_ids
from memfit.models.generation import Decoding, answer_text, generate_ids
from memfit.models.gguf import gguf_file
from memfit.models.load import load_model
from memfit.training.run_folder import MARKER_FILE
from memfit.training.trained_model import run_config, trained_model

COMMAND = "memfit generate"


@dataclass
class Answerer:
    """A loaded model ready to answer prompts laid out as ``data_format``."""

    model: nn.Module
    tokenizer: Any
    data_format: DataFormat


def check_decoding(decoding: Decoding) -> None:
    """The command's numbers, each refused in one line naming its option."""
    if not 1 <= decoding.max_new_tokens <= MAX_TOKENS:
        raise ConfigError(f"--max-new-tokens {decoding.max_new_tokens}: give 1 to {MAX_TOKENS}")
    if not (math.isfinite(decoding.temperature) and decoding.temperature >= 0):
        raise ConfigError(f"--temperature {decoding.temperature}: give 0 (greedy) or a finite "
                          "number above 0 (sampling)")
    if not 0 < decoding.top_p <= 1:
        raise ConfigError(f"--top-p {decoding.top_p}: give a number above 0 and at most 1")


def open_answerer(path: str | Path, trust_code: bool = False,
                  data_format: str | None = None) -> Answerer:
    """The model at ``path`` (a run folder or a model folder) on this machine's device."""
    path = Path(path)
    chosen = _format_option(data_format)
    if (path / "config.yaml").is_file() or (path / MARKER_FILE).exists():
        model, tokenizer, run_format = _from_run(path, trust_code)
    elif (path / "config.json").is_file() or gguf_file(path) is not None:
        model, tokenizer = _from_model_folder(path)
        run_format = DataFormat.CHAT if tokenizer.chat_template else DataFormat.TEXT
    elif (path / "model.safetensors").is_file():
        raise ConfigError(f"{COMMAND} {path}: a state dict without config.json (memfit merge "
                          "of a model.factory run) cannot be rebuilt alone; give the run "
                          "folder instead")
    elif path.is_dir():
        raise ConfigError(f"{COMMAND} {path}: neither a run folder (config.yaml) nor a model "
                          "folder (config.json)")
    else:
        raise ConfigError(f"{COMMAND} {path}: no such folder; give a run folder of memfit "
                          "train or a model folder")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return Answerer(model.to(device).eval(), tokenizer, chosen or run_format)


def answer(answerer: Answerer, prompt: str, decoding: Decoding,
           on_text: Callable[[str], None] | None = None) -> str:
    """The model's answer to ``prompt``; ``on_text`` gets it piece by piece as it comes."""
    check_decoding(decoding)
    ids = prompt_ids(answerer.tokenizer, answerer.data_format, prompt)
    streamer = None if on_text is None else _streamer(answerer.tokenizer, on_text)
    return answer_text(answerer.tokenizer,
                       generate_ids(answerer.model, answerer.tokenizer, ids, decoding, streamer))


def _format_option(value: str | None) -> DataFormat | None:
    if value is None:
        return None
    if value not in PROMPT_FORMATS:
        raise ConfigError(f"--format {value}: give one of {', '.join(PROMPT_FORMATS)}")
    return DataFormat(value)


def _from_run(run_dir: Path, trust_code: bool) -> tuple[nn.Module, Any, DataFormat]:
    config = run_config(run_dir, COMMAND)
    refuse_untrusted_code(config, f"{COMMAND} {run_dir}: its config.yaml", trust_code)
    task = config.model.task
    if task in CLASSIFYING_TASKS:
        raise ConfigError(f"{COMMAND} {run_dir}: the run trained a classifier "
                          f"(model.task={task}); use memfit predict {run_dir} FILE")
    if task is not Task.CAUSAL_LM:
        raise ConfigError(f"{COMMAND} {run_dir}: the run trained model.task={task}; memfit "
                          "generate answers with language models (model.task=causal-lm)")
    model, tokenizer, _ = trained_model(run_dir, config, COMMAND)
    if tokenizer is None:
        raise ConfigError(f"{COMMAND} {run_dir}: the run's model has no tokenizer "
                          f"(model.factory={config.model.factory}); generate needs a model "
                          "folder or preset")
    return model, tokenizer, config.data.format


def _from_model_folder(folder: Path) -> tuple[nn.Module, Any]:
    try:
        architectures = json.loads((folder / "config.json").read_text(encoding="utf-8")
                                   ).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        architectures = []  # load_model names what is wrong with the file
    if any(str(name).endswith("ForSequenceClassification") for name in architectures):
        raise ConfigError(f"{COMMAND} {folder}: a sequence classifier ({architectures[0]}); "
                          "use memfit predict on the run folder that trained it")
    loaded = load_model(ModelConfig(path=str(folder), task=Task.CAUSAL_LM))
    return loaded.model, loaded.tokenizer


def _streamer(tokenizer: Any, on_text: Callable[[str], None]) -> Any:
    """A transformers ``TextStreamer`` that hands each finished piece of the answer (not
    the prompt) to ``on_text`` instead of printing it."""
    from transformers import TextStreamer

    class _Handing(TextStreamer):
        def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
            if text:
                on_text(text)

    return _Handing(tokenizer, skip_prompt=True, skip_special_tokens=True)
