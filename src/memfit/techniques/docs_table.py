"""README.md's "Saving memory" table, from the registries: one row per technique spec (its
``docs_row`` and its keys, in the order training applies them), then the optimizers' rows.
``python -m memfit.techniques.docs_table`` prints it; a test keeps the README equal to it."""

from __future__ import annotations

from memfit.techniques.registry import TECHNIQUES

# What optimizer.* offers beside the techniques (docs/optimizers.md has one row per name).
OPTIMIZER_ROWS = (
    ("every optimizer of docs/optimizers.md's table (generated from the registry), the GaLore "
     "family among them (svd, randomized SVD, Online Subspace Descent, APOLLO, APOLLO-Mini)",
     "`optimizer.name`, each one's own `optimizer.betas`/`eps` defaults, `optimizer.galore.*`"),
    ("any `torch.optim.Optimizer` you bring (planned from one step on fake tensors)",
     "`optimizer.name=package.module:Class`, `optimizer.kwargs`"),
    ("layer-wise updates that keep gradient accumulation", "`optimizer.layerwise=true`"),
)


def technique_table() -> str:
    rows = [(spec.docs_row, ", ".join(f"`{key}`" for key in spec.keys)) for spec in TECHNIQUES]
    lines = ["| technique | keys |", "|---|---|"]
    lines += [f"| {technique} | {keys} |" for technique, keys in [*rows, *OPTIMIZER_ROWS]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(technique_table(), end="")
