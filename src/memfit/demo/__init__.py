"""The built-in demo that ``memfit train`` runs when given no arguments.

``assets/`` holds everything it needs offline, all made by
``scripts/pretrain_demo_base.py`` from ``assets/corpus.txt`` (Aesop's Fables, Townsend's
1867 translation, public domain):

- ``base/``: a ~1M-parameter Llama model pretrained on the corpus, with its BPE tokenizer
  and chat template (a normal Hugging Face model folder);
- ``instructions.jsonl``: ``{"prompt", "response"}`` rows about the fables (titles,
  morals, openings, next sentences) that the base model was never trained on.
"""

from __future__ import annotations

from pathlib import Path

# model.preset naming the demo's pretrained base (``assets/base/``)
DEMO_BASE = "demo-base"


def demo_assets_dir() -> Path:
    """The folder holding ``corpus.txt``, ``instructions.jsonl`` and ``base/``."""
    # Plain __file__ rather than importlib.resources: the assets must be a real folder
    # on disk for from_pretrained, and memfit is never installed as a zip.
    return Path(__file__).resolve().parent / "assets"
