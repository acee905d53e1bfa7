"""Bad input gets one DataError line naming the path, row, field or value."""

from __future__ import annotations

import pytest

from memfit._utils.errors import DataError
from memfit.config.schema import DataConfig, DataFormat
from memfit.data import build_datasets


def test_missing_file_names_the_path(tmp_path, tokenizer, cfg):
    with pytest.raises(DataError, match=r"data.path .*nowhere.jsonl does not exist"):
        build_datasets(cfg(tmp_path / "nowhere.jsonl", "text"), tokenizer)


@pytest.mark.parametrize("name", ["empty.jsonl", "empty.csv", "empty.txt", "empty.npz"])
def test_empty_file_names_the_path(name, tmp_path, tokenizer, cfg):
    (tmp_path / name).write_text("")
    with pytest.raises(DataError, match=rf"data file .*{name} is empty"):
        build_datasets(
            cfg(tmp_path / name, "tensors" if name.endswith("npz") else "text"), tokenizer
        )


def test_blank_text_file_has_no_rows(tmp_path, tokenizer, cfg):
    (tmp_path / "blank.txt").write_text("\n\n  \n")
    with pytest.raises(DataError, match=r"blank.txt has no rows"):
        build_datasets(cfg(tmp_path / "blank.txt", "text"), tokenizer)


def test_unparsable_file_names_the_path_and_line(tmp_path, tokenizer, cfg):
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"text": 1\n')
    with pytest.raises(DataError, match=r"data file .*bad.jsonl: line 2 is not valid JSON: "):
        build_datasets(cfg(tmp_path / "bad.jsonl", "text"), tokenizer)


@pytest.mark.parametrize(
    ("format", "row", "field"),
    [
        ("text", {"body": "x"}, "text"),
        ("instruction", {"prompt": "x"}, "response"),
        ("instruction", {"instruction": "x", "input": "y"}, "output"),
        ("instruction", {"question": "x"}, "prompt"),
        ("chat", {"text": "x"}, "messages"),
    ],
)
def test_missing_field_names_file_row_and_field(
    format, row, field, tmp_path, tokenizer, cfg, jsonl
):
    good = {
        "text": "a",
        "prompt": "a",
        "response": "b",
        "messages": [{"role": "user", "content": "a"}],
    }
    path = jsonl(tmp_path / "d.jsonl", [good, good, row])
    with pytest.raises(
        DataError, match=rf"d.jsonl row 3: missing field '{field}'; this format needs"
    ):
        build_datasets(cfg(path, format), tokenizer)


def test_non_string_field_is_named(tmp_path, tokenizer, cfg, jsonl):
    path = jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "response": ["b"]}])
    with pytest.raises(DataError, match=r"row 1: field 'response' must be a string, got list"):
        build_datasets(cfg(path, "instruction"), tokenizer)


def test_unknown_extension_lists_the_supported_ones(tmp_path, tokenizer, cfg):
    (tmp_path / "d.xml").write_text("<a/>")
    with pytest.raises(
        DataError, match=r"d.xml has an unsupported extension; supported: .jsonl, .json"
    ):
        build_datasets(cfg(tmp_path / "d.xml", "text"), tokenizer)


def test_folder_without_data_files(tmp_path, tokenizer, cfg):
    (tmp_path / "notes.md").write_text("hi")
    with pytest.raises(DataError, match=r"is a folder with no data files; supported: "):
        build_datasets(cfg(tmp_path, "text"), tokenizer)


def test_folder_mixing_kinds(tmp_path, tokenizer, cfg, jsonl):
    jsonl(tmp_path / "a.jsonl", [{"text": "a"}])
    (tmp_path / "b.csv").write_text("text\nb\n")
    with pytest.raises(DataError, match=r"mixes files of kinds csv, json"):
        build_datasets(cfg(tmp_path, "text"), tokenizer)


def test_unknown_format_lists_the_choices(tmp_path, tokenizer, cfg, jsonl):
    path = jsonl(tmp_path / "d.jsonl", [{"text": "a"}])
    with pytest.raises(
        DataError,
        match=r"data.format 'poetry' is unknown; choose one of text, instruction, chat, tensors",
    ):
        build_datasets(cfg(path, "poetry"), tokenizer)


def test_the_real_config_with_its_format_enum(tmp_path, tokenizer, jsonl):
    path = jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "response": "b"}] * 4)
    config = DataConfig(path=path, format=DataFormat.INSTRUCTION, eval_fraction=0.25)
    splits = build_datasets(config, tokenizer)
    assert (len(splits.train), len(splits.eval)) == (3, 1)
    with pytest.raises(DataError, match=r"data.path is not set"):
        build_datasets(DataConfig(), tokenizer)


def test_rows_given_to_the_tensors_format(tmp_path, cfg, jsonl):
    path = jsonl(tmp_path / "d.jsonl", [{"text": "a"}])
    with pytest.raises(DataError, match=r"holds rows but data.format is 'tensors'"):
        build_datasets(cfg(path, "tensors"), None)


def test_token_format_without_tokenizer(tmp_path, cfg, jsonl):
    path = jsonl(tmp_path / "d.jsonl", [{"text": "a"}])
    with pytest.raises(DataError, match=r"data.format 'text' needs a tokenizer"):
        build_datasets(cfg(path, "text"), None)
