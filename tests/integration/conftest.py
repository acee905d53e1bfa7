"""Fixtures for end-to-end tests (helpers live in cli_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import no_loading_bars, write_instructions


@pytest.fixture
def instructions(tmp_path: Path) -> Path:
    return write_instructions(tmp_path / "rows.jsonl")


@pytest.fixture
def quiet_transformers():
    """transformers' per-file loading bars hidden, as the CLI hides them."""
    with no_loading_bars():
        yield
