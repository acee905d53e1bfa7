"""docs/guide.md, "Bring your own module", run block by block (guide_helpers) as a reader
would, so the guide and what memfit does cannot drift apart."""

from __future__ import annotations

import re
from pathlib import Path

from guide_helpers import run_section


def test_bring_your_own_module_runs_as_the_guide_shows(tmp_path: Path):
    printed = run_section("## 4. Bring your own module", tmp_path)
    assert (tmp_path / "runs/net/adapter/buffers.safetensors").is_file()
    assert re.search(r"mean squared error \d", "".join(printed))
    assert "the merged folder and base + adapter predict the same" in printed[-1]
