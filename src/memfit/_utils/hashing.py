"""SHA-256 of a file, read in chunks (checkpoint manifests, data fingerprints)."""

from __future__ import annotations

import hashlib
from pathlib import Path

_CHUNK_BYTES = 8 * 2**20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
