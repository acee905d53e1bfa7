"""manifest.json: an intact folder verifies; every kind of damage is named in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memfit.checkpoint.manifest import (
    MANIFEST_FILE,
    CheckpointKind,
    DamagedCheckpoint,
    read_manifest,
    verify_checkpoint,
    write_manifest,
)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    folder = tmp_path / "checkpoints" / "step-6"
    folder.mkdir(parents=True)
    (folder / "optimizer.pt").write_bytes(bytes(range(256)) * 7)
    (folder / "trainer_state.json").write_text('{"step": 6}')
    write_manifest(folder, CheckpointKind.SINGLE_PROCESS, 6)
    return folder


def test_an_intact_folder_verifies(folder: Path):
    manifest = verify_checkpoint(folder)
    assert manifest.kind is CheckpointKind.SINGLE_PROCESS and manifest.step == 6
    assert manifest.files["optimizer.pt"].bytes == 1792
    assert set(manifest.files) == {"optimizer.pt", "trainer_state.json"}


def _reason(folder: Path) -> str:
    with pytest.raises(DamagedCheckpoint) as caught:
        verify_checkpoint(folder)
    assert "\n" not in str(caught.value) and str(folder) in str(caught.value)
    return caught.value.reason


def test_a_truncated_file_is_named_with_both_sizes(folder: Path):
    (folder / "optimizer.pt").write_bytes(bytes(812))
    assert _reason(folder) == "optimizer.pt: 812 bytes, manifest.json says 1792"


def test_one_altered_byte_is_caught_by_the_hash(folder: Path):
    data = bytearray((folder / "optimizer.pt").read_bytes())
    data[900] ^= 1
    (folder / "optimizer.pt").write_bytes(bytes(data))
    assert _reason(folder) == "optimizer.pt: its SHA-256 differs from manifest.json"


def test_a_missing_file(folder: Path):
    (folder / "optimizer.pt").unlink()
    assert _reason(folder) == "optimizer.pt: missing"


def test_an_unlisted_file_is_damage_not_ignored(folder: Path):
    (folder / ".metadata").write_bytes(b"planted")
    assert _reason(folder) == ".metadata: not listed in manifest.json"


def test_a_folder_without_a_manifest(folder: Path):
    (folder / MANIFEST_FILE).unlink()
    assert _reason(folder) == "no manifest.json"


@pytest.mark.parametrize("manifest, reason", [
    ("{not json", "manifest.json is not valid JSON"),
    ('{"format": 2}', "manifest.json is not format 1"),
    ('{"format": 1, "kind": "pickle", "step": 6, "files": {}}', "has kind 'pickle'"),
    ('{"format": 1, "kind": "sharded", "step": -1, "files": {}}', "has step -1"),
    ('{"format": 1, "kind": "sharded", "step": 6, "files": {"../x": {"bytes": 1, '
     '"sha256": "' + "0" * 64 + '"}}}', "has an invalid entry '../x'"),
])
def test_an_invalid_manifest(folder: Path, manifest: str, reason: str):
    (folder / MANIFEST_FILE).write_text(manifest)
    with pytest.raises(DamagedCheckpoint, match="is damaged") as caught:
        read_manifest(folder)
    assert reason in caught.value.reason


def test_a_renamed_folder_does_not_pass_for_another_step(folder: Path):
    renamed = folder.rename(folder.parent / "step-9")
    assert _reason(renamed) == "manifest.json is for step 6"


def test_the_kind_is_read_from_the_manifest(folder: Path):
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    (folder / MANIFEST_FILE).write_text(json.dumps({**manifest, "kind": "sharded"}))
    assert read_manifest(folder).kind is CheckpointKind.SHARDED
