"""Where a text data file goes wrong, in words that name the place: the byte offset and
line of the first byte that is not UTF-8, or the line of JSON that does not parse.

``datasets`` reports these as a traceback or as an offset into an internal buffer, so the
UTF-8 check runs before it reads a file (in chunks, at the decoder's speed), and the JSON
check runs only after it failed.
"""

from __future__ import annotations

import codecs
import json

from memfit._utils.errors import DataError

CHUNK_BYTES = 1 << 20


def check_utf8(file: str, chunk_bytes: int = CHUNK_BYTES) -> None:
    """Raise a DataError naming the byte offset and line of the first invalid byte."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0  # bytes of the file before ``chunk``
    lines_before = 0  # newlines in those bytes
    with open(file, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            # The decoder holds back a character cut by the chunk boundary; an error's
            # position counts from those held-back bytes.
            held_back = len(decoder.getstate()[0])
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as error:
                _raise_not_utf8(file, offset - held_back + error.start, error,
                                lines_before + chunk[:max(error.start - held_back, 0)].count(b"\n"))
            offset += len(chunk)
            lines_before += chunk.count(b"\n")
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError as error:
            _raise_not_utf8(file, offset - len(error.object) + error.start, error, lines_before)


def _raise_not_utf8(file: str, offset: int, error: UnicodeDecodeError, newlines: int) -> None:
    byte = error.object[error.start]
    raise DataError(
        f"data file {file} is not UTF-8 text: byte 0x{byte:02x} at byte offset {offset} "
        f"(line {newlines + 1}): {error.reason}; save the file as UTF-8")


def json_problem(file: str) -> str | None:
    """Why ``file`` (UTF-8 JSON Lines, or one JSON document) is not what the json reader
    takes, naming the line; None when its syntax is fine."""
    with open(file, encoding="utf-8") as handle:
        text = handle.read()
    try:
        json.loads(text)
        return None  # one JSON document
    except json.JSONDecodeError as error:
        if not (file.endswith(".jsonl") or error.msg == "Extra data"):
            return f"line {error.lineno} is not valid JSON: {error.msg} (column {error.colno})"
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            return f"line {number} is not valid JSON: {error.msg} (column {error.colno})"
        if not isinstance(row, dict):
            return f"line {number} holds a JSON {_JSON_KINDS[type(row)]}, not an object"
    return None


_JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}
