"""docs/optimizers.md's "What each one is" table, from the registry: one row per spec
(its ``docs_row``) and the class-path row. ``python -m memfit.techniques.optimizers.docs_table``
prints it; a test keeps the docs equal to it."""

from __future__ import annotations

from memfit.techniques.optimizers.class_path import DOCS_ROW
from memfit.techniques.optimizers.registry import SPECS
from memfit.techniques.own_keys import defaults


def optimizer_table() -> str:
    rows = [(f"`{name}`", *spec.docs_row, _options({**spec.options, **defaults(spec.own)}))
            for name, spec in SPECS.items()]
    rows.append(("`package.module:Class` or `file.py:Class`", *DOCS_ROW, "`optimizer.kwargs`"))
    lines = ["| `optimizer.name` | implementation | state per parameter | reads, with its "
             "defaults for null |", "|---|---|---|---|"]
    lines += [f"| {' | '.join(row)} |" for row in rows]
    return "\n".join(lines) + "\n"


def _options(options: dict) -> str:
    """``betas (0.9, 0.999), eps 1e-08`` (besides lr, weight_decay and layerwise)."""
    shown = [f"`optimizer.{key}`" + ("" if default is None else f" {default}")
             for key, default in options.items()]
    return ", ".join(shown) or "-"


if __name__ == "__main__":
    print(optimizer_table(), end="")
