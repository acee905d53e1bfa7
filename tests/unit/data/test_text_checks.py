"""The place named for a non-UTF-8 byte or a bad JSON line is the real one, wherever the
reading chunks happen to split the file."""

from __future__ import annotations

import pytest

from memfit._utils.errors import DataError
from memfit.data.text_checks import check_utf8, json_problem

TEXT = "a\nné\n€ 😀\n".encode()


@pytest.mark.parametrize("chunk_bytes", [1, 2, 3, 5, 1 << 20])
@pytest.mark.parametrize("insert_at", range(len(TEXT) + 1))
@pytest.mark.parametrize("bad", [b"\xe9", b"\xff", b"\xe2\x82", b"\xf0\x9f\x98"])
def test_first_invalid_byte_offset_and_line(tmp_path, chunk_bytes, insert_at, bad):
    data = TEXT[:insert_at] + bad + TEXT[insert_at:]
    with pytest.raises(UnicodeDecodeError) as decoded:  # the oracle: Python's own decoder
        data.decode("utf-8")
    offset = decoded.value.start
    line = data[:offset].count(b"\n") + 1
    (tmp_path / "d.txt").write_bytes(data)
    with pytest.raises(DataError, match=rf"byte offset {offset} \(line {line}\)"):
        check_utf8(str(tmp_path / "d.txt"), chunk_bytes=chunk_bytes)


@pytest.mark.parametrize("chunk_bytes", [1, 3, 1 << 20])
def test_valid_utf8_passes(tmp_path, chunk_bytes):
    (tmp_path / "d.txt").write_bytes(TEXT)
    check_utf8(str(tmp_path / "d.txt"), chunk_bytes=chunk_bytes)


@pytest.mark.parametrize("name, text, problem", [
    ("d.jsonl", '{"a": 1}\n\n{"a": 2\n', "line 3 is not valid JSON: Expecting ',' delimiter"),
    ("d.jsonl", '{"a": 1}\n[1]\n', "line 2 holds a JSON array, not an object"),
    ("d.json", '[{"a": 1},\n {"a": }]', "line 2 is not valid JSON: Expecting value (column 8)"),
    ("d.json", '{"a": 1}\n{"a" 2}\n', "line 2 is not valid JSON"),  # JSON Lines named .json
    ("d.jsonl", '{"a": 1}\n{"a": 2}\n', None),
])
def test_json_problem_names_the_line(tmp_path, name, text, problem):
    (tmp_path / name).write_text(text)
    found = json_problem(str(tmp_path / name))
    assert (found is None) if problem is None else found.startswith(problem)
