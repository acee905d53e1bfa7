"""What ``model.path`` names a GGUF for, and the damaged files refused before transformers
reads them (a whole file is written in tests/integration/test_gguf.py)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from memfit._utils.errors import ModelError
from memfit.models.gguf import check_gguf, gguf_file


def test_a_gguf_file_or_a_folder_with_one_and_no_weights_names_it(tmp_path: Path):
    (tmp_path / "Model-Q8_0.GGUF").write_bytes(b"")
    (tmp_path / "config.json").write_text("{}")  # metadata beside it is not weights
    assert gguf_file(tmp_path) == tmp_path / "Model-Q8_0.GGUF"
    assert gguf_file(tmp_path / "elsewhere.gguf") == tmp_path / "elsewhere.gguf"  # check_gguf
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert gguf_file(tmp_path) is None  # a Hugging Face folder, whatever else it holds
    assert gguf_file(tmp_path / "missing") is None


def test_a_folder_with_two_gguf_files_asks_for_one(tmp_path: Path):
    for name in ("a-Q4_K_M.gguf", "a-Q8_0.gguf"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(ModelError, match=r"holds 2 GGUF files \(a-Q4_K_M.gguf, a-Q8_0.gguf\) "
                                         r"and no safetensors weights; set model.path to one"):
        gguf_file(tmp_path)


@pytest.mark.parametrize(("contents", "problem"), [
    (b"PK\x03\x04" + bytes(60), "it does not start with the magic bytes GGUF"),
    (b"GGUF" + struct.pack("<IB", 3, 0), "9 bytes, fewer than the 24-byte GGUF header"),
    (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "GGUF version 1; transformers reads versions 2 "
                                              "and 3"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 0), "it holds no tensors"),
    (b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + bytes(3), "27 bytes, cut short or damaged"),
])
def test_a_damaged_gguf_is_named_with_what_is_wrong(tmp_path: Path, contents: bytes,
                                                    problem: str):
    file = tmp_path / "x.gguf"
    file.write_bytes(contents)
    with pytest.raises(ModelError) as raised:
        check_gguf(file)
    assert str(raised.value).startswith(f"{file} is truncated or not a GGUF file: {problem}")


def test_a_missing_gguf_file_is_named(tmp_path: Path):
    with pytest.raises(ModelError, match="no such file"):
        check_gguf(tmp_path / "nothing.gguf")
