from pathlib import Path

from memfit.config.reference import help_text, key_docs, markdown

DOCS = Path(__file__).resolve().parents[3] / "docs" / "config.md"


def test_docs_config_md_is_generated_from_the_schema():
    assert DOCS.read_text() == markdown(), (
        "docs/config.md is stale: run `python -m memfit.config.reference > docs/config.md`"
    )


def test_every_key_has_help_and_appears_in_cli_help():
    text = help_text()
    for item in key_docs():
        assert item.help.strip(), item.key
        assert item.key in text
