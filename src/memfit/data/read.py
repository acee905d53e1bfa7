"""Files on disk -> rows, read through Hugging Face ``datasets``.

``data.path`` is one data file, a folder written by ``datasets.Dataset.save_to_disk``, or a
folder of data files of one kind. Each file is read on its own and kept as its own
``RowSource`` (never concatenated), so an error can name the file and the row in it.

A ``.txt`` file holds one document per paragraph: paragraphs are separated by one or more
blank lines, surrounding whitespace is stripped, and empty paragraphs are skipped. This keeps
hard-wrapped prose together, where one document per line would put an eos after every line.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memfit._utils.errors import DataError
from memfit.data.text_checks import check_utf8, json_problem

if TYPE_CHECKING:
    import datasets

# File extension -> the `datasets` builder that reads it. ".npz"/".pt" are tensors
# (see tensors.py) and never go through `datasets`.
ROW_BUILDERS = {
    ".jsonl": "json",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".txt": "text",
}
# Builders reading text, which must be UTF-8 (parquet is binary).
TEXT_BUILDERS = ("json", "csv", "text")
TENSOR_EXTENSIONS = (".npz", ".pt")
SUPPORTED_EXTENSIONS = (*ROW_BUILDERS, *TENSOR_EXTENSIONS)
_SUPPORTED = ", ".join(SUPPORTED_EXTENSIONS) + ", or a datasets.save_to_disk folder"

# Rows are turned into Python dicts this many at a time, so a large file is never held
# as Python objects all at once.
ROW_BATCH_SIZE = 1000


@dataclass(frozen=True)
class RowSource:
    """One file (or one save_to_disk folder) and its rows."""

    path: str
    table: datasets.Dataset


@dataclass(frozen=True)
class Row:
    """One row and where it came from: ``where`` reads "FILE row N" (N counts from 1)."""

    where: str
    values: dict[str, Any]


def is_saved_dataset(folder: str) -> bool:
    """True for a folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    names = set(os.listdir(folder))
    return "dataset_dict.json" in names or {"dataset_info.json", "state.json"} <= names


def data_files(path: str, key: str = "data.path") -> list[str]:
    """The data files that ``path`` (the value of ``key``) names: itself, or the files of
    one kind in a folder.

    Returns [path] for a save_to_disk folder. Raises DataError for a missing path, an
    unsupported extension, an empty file, or a folder with no or mixed kinds of files.
    """
    if not os.path.exists(path):
        raise DataError(f"{key} {path} does not exist; give a data file ({_SUPPORTED})")
    if os.path.isdir(path):
        if is_saved_dataset(path):
            return [path]
        files = sorted(
            os.path.join(path, name)
            for name in os.listdir(path)
            if not name.startswith(".") and _extension(name) in SUPPORTED_EXTENSIONS
        )
        if not files:
            raise DataError(
                f"{key} {path} is a folder with no data files; supported: {_SUPPORTED}"
            )
        # .json and .jsonl are one kind: both are read by the json builder.
        kinds = sorted({ROW_BUILDERS.get(_extension(f), _extension(f)) for f in files})
        if len(kinds) > 1:
            raise DataError(
                f"{key} {path} mixes files of kinds {', '.join(kinds)}; put one kind per folder"
            )
    else:
        files = [path]
    for file in files:
        if _extension(file) not in SUPPORTED_EXTENSIONS:
            raise DataError(
                f"{key} {file} has an unsupported extension; supported: {_SUPPORTED}"
            )
        if os.path.getsize(file) == 0:
            raise DataError(f"data file {file} is empty")
    return files


def holds_tensors(files: Sequence[str]) -> bool:
    """True when the files are .npz/.pt tensors rather than rows (data_files gives one kind)."""
    return _extension(files[0]) in TENSOR_EXTENSIONS


def read_rows(files: Sequence[str], txt_field: str) -> list[RowSource]:
    """Read each row file (or save_to_disk folder) into a ``datasets.Dataset``.

    ``txt_field`` names the column that a .txt file's paragraphs go into.
    """
    with _datasets_quiet():
        sources = [RowSource(file, _read_one(file, txt_field)) for file in files]
    for source in sources:
        if len(source.table) == 0:
            raise DataError(f"data file {source.path} has no rows")
    return sources


def iter_rows(sources: Sequence[RowSource], indices: Sequence[int]) -> Iterator[list[Row]]:
    """Yield the rows at ``indices`` (global, ascending, over all sources) in batches."""
    start = 0
    position = 0
    for source in sources:
        stop = start + len(source.table)
        local = []
        while position < len(indices) and indices[position] < stop:
            local.append(indices[position] - start)
            position += 1
        for offset in range(0, len(local), ROW_BATCH_SIZE):
            chunk = local[offset : offset + ROW_BATCH_SIZE]
            columns = source.table.select(chunk).to_dict()
            yield [
                Row(
                    f"{source.path} row {row + 1}",
                    {name: values[i] for name, values in columns.items()},
                )
                for i, row in enumerate(chunk)
            ]
        start = stop


@contextlib.contextmanager
def _datasets_quiet() -> Iterator[None]:
    # `datasets` draws "Generating train split" bars and logs "Failed to read file ..." on
    # stderr, where the CLI promises exactly one line for a bad-input error (the DataError
    # says what failed); reading local files is quick anyway.
    import datasets  # ~1 s (pandas, pyarrow): only when rows are read

    already_off = datasets.are_progress_bars_disabled()
    verbosity = datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        yield
    finally:
        datasets.logging.set_verbosity(verbosity)
        if not already_off:
            datasets.enable_progress_bars()


def _read_one(file: str, txt_field: str) -> datasets.Dataset:
    import datasets  # ~1 s (pandas, pyarrow): only when rows are read

    if os.path.isdir(file):
        return _load_saved(file)
    builder = ROW_BUILDERS[_extension(file)]
    if builder in TEXT_BUILDERS:
        check_utf8(file)
    options: dict[str, Any] = {"sample_by": "paragraph"} if builder == "text" else {}
    try:
        table = datasets.load_dataset(builder, data_files=file, split="train", **options)
    except Exception as error:  # any failure to parse is the file's to fix
        problem = json_problem(file) if builder == "json" else None
        if problem is not None:
            raise DataError(f"data file {file}: {problem}") from error
        raise DataError(
            f"cannot read data file {file} as {builder}: {_root_cause(error)}"
        ) from error
    if builder == "text":
        # Paragraph splitting keeps the newlines around a paragraph; a document is its text.
        table = table.map(lambda row: {"text": row["text"].strip()}).filter(
            lambda row: bool(row["text"])
        )
        if txt_field != "text":
            table = table.rename_column("text", txt_field)
    return table


def _load_saved(folder: str) -> datasets.Dataset:
    import datasets  # ~1 s (pandas, pyarrow): only when rows are read

    try:
        loaded = datasets.load_from_disk(folder)
    except Exception as error:  # a damaged folder is the user's to fix
        raise DataError(f"cannot read saved dataset {folder}: {_root_cause(error)}") from error
    if isinstance(loaded, datasets.DatasetDict):
        if "train" in loaded:
            return loaded["train"]
        if len(loaded) == 1:
            return next(iter(loaded.values()))
        raise DataError(
            f"saved dataset {folder} has splits {', '.join(loaded)} and none is named 'train'; "
            "save the split to train on alone, or name it 'train'"
        )
    return loaded


def _root_cause(error: BaseException) -> str:
    # `datasets` wraps parser errors ("An error occurred while generating the dataset");
    # the innermost one says what is wrong with the file.
    while error.__cause__ is not None:
        error = error.__cause__
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def _extension(name: str) -> str:
    return os.path.splitext(name)[1].lower()
