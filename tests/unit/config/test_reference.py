from pathlib import Path

from memfit.config.reference import key_docs
from memfit.techniques.config_reference import help_text, markdown

DOCS = Path(__file__).resolve().parents[3] / "docs" / "config.md"


def test_docs_config_md_is_generated_from_the_schema_and_the_optimizers_own_keys():
    assert DOCS.read_text() == markdown(), (
        "docs/config.md is stale: run "
        "`python -m memfit.techniques.config_reference > docs/config.md`"
    )
    assert "| `optimizer.momentum` | float | `0.0` | optimizer.name=sgd: " in markdown()


def test_every_key_has_help_and_appears_in_cli_help():
    text = help_text()
    for item in key_docs():
        assert item.help.strip(), item.key
        assert item.key in text
