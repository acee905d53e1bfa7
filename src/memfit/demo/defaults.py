"""Where the built-in demo's config lives: the base of `memfit train` with no CONFIG."""

from __future__ import annotations

from pathlib import Path


def demo_config_path() -> Path:
    return Path(__file__).resolve().parent / "demo.yaml"
