"""accuracy_cases (factories named as 'accuracy_cases:...') must be importable; the corpus
the tests of techniques on some blocks train tiny Llamas of several depths on."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy_cases import write_data  # noqa: E402 -- importable from here once on the path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A module's folder of tiny Llama checkpoints (accuracy_cases.tiny_llama_folder)."""
    return tmp_path_factory.mktemp("blocks")


@pytest.fixture(scope="module")
def corpus(folder):
    return write_data(folder)["text"]
