"""``manifest.json``: what a checkpoint folder holds, so that damage is detected before
anything is trained on.

Written last into the staging folder, before it is renamed into place::

    {"format": 1, "kind": "single-process" | "sharded", "step": 6,
     "files": {"optimizer.pt": {"bytes": 1620, "sha256": "..."}, ...}}

The kind decides how the checkpoint is read (never which files happen to exist). A folder
is intact when its manifest is valid, names its own step, and every file it lists is
there with that size and SHA-256, and nothing else is: an unlisted file is one that
something might read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from memfit._utils.errors import CheckpointError
from memfit._utils.hashing import sha256_file

MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1
STEP_FOLDER = re.compile(r"^step-(\d+)$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class CheckpointKind(str, Enum):
    SINGLE_PROCESS = "single-process"  # safetensors + weights-only torch files
    SHARDED = "sharded"                # FSDP2 shards through torch.distributed.checkpoint


@dataclass(frozen=True)
class FileRecord:
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    kind: CheckpointKind
    step: int
    files: dict[str, FileRecord]


class DamagedCheckpoint(CheckpointError):
    """A checkpoint folder whose manifest is missing or invalid, or whose files differ
    from it; ``reason`` says how, for a message that names the folder once."""

    def __init__(self, folder: Path, reason: str):
        super().__init__(f"{folder} is damaged ({reason})")
        self.folder, self.reason = folder, reason


def write_manifest(folder: Path, kind: CheckpointKind, step: int) -> None:
    """Record every file now in ``folder``; call once all of them are complete."""
    files = {path.name: {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
             for path in sorted(folder.iterdir()) if path.name != MANIFEST_FILE}
    manifest = {"format": FORMAT_VERSION, "kind": kind.value, "step": step, "files": files}
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))


def _is_plain_name(name: object) -> bool:
    return (isinstance(name, str) and name not in ("", ".", "..", MANIFEST_FILE)
            and "/" not in name and "\\" not in name)


def _file_record(name: str, entry: object) -> FileRecord | None:
    if not (_is_plain_name(name) and isinstance(entry, dict)
            and set(entry) == {"bytes", "sha256"}):
        return None
    size, sha256 = entry["bytes"], entry["sha256"]
    if (isinstance(size, bool) or not isinstance(size, int) or size < 0
            or not isinstance(sha256, str) or not _SHA256.match(sha256)):
        return None
    return FileRecord(size, sha256)


def read_manifest(folder: Path) -> Manifest:
    """The manifest of ``folder``, checked for shape only (``verify_checkpoint`` checks
    the files); DamagedCheckpoint when it is missing or not one memfit wrote."""
    path = folder / MANIFEST_FILE
    if not path.is_file():
        raise DamagedCheckpoint(folder, f"no {MANIFEST_FILE}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise DamagedCheckpoint(folder, f"{MANIFEST_FILE} is not valid JSON: {error}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT_VERSION:
        raise DamagedCheckpoint(folder, f"{MANIFEST_FILE} is not format {FORMAT_VERSION}")
    kinds = [kind.value for kind in CheckpointKind]
    if raw.get("kind") not in kinds:
        raise DamagedCheckpoint(folder, f"{MANIFEST_FILE} has kind {raw.get('kind')!r}, "
                                        f"expected one of {', '.join(kinds)}")
    step = raw.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise DamagedCheckpoint(folder, f"{MANIFEST_FILE} has step {step!r}")
    if not isinstance(raw.get("files"), dict):
        raise DamagedCheckpoint(folder, f"{MANIFEST_FILE} has no files table")
    files = {}
    for name, entry in raw["files"].items():
        record = _file_record(name, entry)
        if record is None:
            raise DamagedCheckpoint(folder, f"{MANIFEST_FILE} has an invalid entry {name!r}")
        files[name] = record
    return Manifest(CheckpointKind(raw["kind"]), step, files)


def verify_checkpoint(folder: Path) -> Manifest:
    """The manifest of an intact ``folder``; DamagedCheckpoint saying what differs."""
    manifest = read_manifest(folder)
    match = STEP_FOLDER.match(folder.name)
    if match and int(match.group(1)) != manifest.step:
        raise DamagedCheckpoint(folder, f"{MANIFEST_FILE} is for step {manifest.step}")
    present = {path.name: path for path in folder.iterdir() if path.name != MANIFEST_FILE}
    unlisted = sorted(set(present) - set(manifest.files))
    if unlisted:
        raise DamagedCheckpoint(folder, f"{unlisted[0]}: not listed in {MANIFEST_FILE}")
    for name, record in manifest.files.items():  # sizes first: cheap, and the usual damage
        path = present.get(name)
        if path is None or not path.is_file() or path.is_symlink():
            raise DamagedCheckpoint(folder, f"{name}: missing")
        size = path.stat().st_size
        if size != record.bytes:
            raise DamagedCheckpoint(folder, f"{name}: {size} bytes, {MANIFEST_FILE} says "
                                            f"{record.bytes}")
    for name, record in manifest.files.items():
        if sha256_file(present[name]) != record.sha256:
            raise DamagedCheckpoint(folder, f"{name}: its SHA-256 differs from {MANIFEST_FILE}")
    return manifest
