import os
import stat
from pathlib import Path

import pytest

from memfit._utils.atomic import staged_folder, write_text


def test_written_files_get_the_umask_mode_not_a_private_one(tmp_path: Path):
    old = os.umask(0o022)
    try:
        write_text(tmp_path / "a.txt", "hello")
        with staged_folder(tmp_path / "folder") as folder:
            (folder / "x").write_text("x")
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").read_text() == "hello"
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "folder").stat().st_mode) == 0o755


def test_a_failed_staging_leaves_the_previous_folder(tmp_path: Path):
    final = tmp_path / "out"
    final.mkdir()
    (final / "kept").write_text("old")
    with pytest.raises(RuntimeError), staged_folder(final) as folder:
        (folder / "new").write_text("new")
        raise RuntimeError("killed mid-write")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert (final / "kept").read_text() == "old"
