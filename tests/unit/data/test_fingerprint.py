"""Data fingerprints: every file under the data paths, and what changed between two."""

from __future__ import annotations

import hashlib
from pathlib import Path

from memfit._utils.hashing import fingerprint_changes
from memfit.data.fingerprint import data_fingerprint


def test_files_and_folders_are_listed_with_size_and_hash(tmp_path: Path):
    (tmp_path / "rows.jsonl").write_text("{}\n")
    images = tmp_path / "images"
    (images / "a").mkdir(parents=True)
    (images / "a" / "1.png").write_bytes(b"png")
    (images / ".cache").write_bytes(b"ignored")
    found = data_fingerprint([str(tmp_path / "rows.jsonl"), str(images), None])
    assert found == {
        str(tmp_path / "rows.jsonl"): {"bytes": 3, "sha256": hashlib.sha256(b"{}\n").hexdigest()},
        str(images / "a" / "1.png"): {"bytes": 3, "sha256": hashlib.sha256(b"png").hexdigest()},
    }


def test_changes_name_each_file_and_how():
    same = {"bytes": 1, "sha256": "a"}
    recorded = {"kept": same, "edited": same, "grown": same, "gone": same}
    current = {"kept": same, "edited": {"bytes": 1, "sha256": "b"},
               "grown": {"bytes": 2, "sha256": "c"}, "new": same}
    assert fingerprint_changes(recorded, current) == [
        "edited (contents)", "gone (removed)", "grown (size)", "new (added)"]
    assert fingerprint_changes(recorded, recorded) == []
