"""Fixtures for end-to-end tests (helpers live in cli_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import write_instructions


@pytest.fixture
def instructions(tmp_path: Path) -> Path:
    return write_instructions(tmp_path / "rows.jsonl")
