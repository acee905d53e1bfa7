"""docs/config.md and ``memfit train --help``'s list of keys: the schema's
(memfit.config.reference) with every optimizer's and memory technique's own keys (their
specs' blocks, techniques/own_keys.py), each generated from where it is declared.
``python -m memfit.techniques.config_reference > docs/config.md``; a test keeps it in sync.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

from memfit.config import reference
from memfit.techniques.optimizers.registry import SPECS
from memfit.techniques.own_keys import own_key_docs
from memfit.techniques.registry import TECHNIQUES


def _own_keys() -> Iterator[reference.KeyDoc]:
    yield from own_key_docs("optimizer", [(f"optimizer.name={spec.name}", spec.own)
                                          for spec in SPECS.values()])
    yield from own_key_docs("memory", [(spec.name, spec.own) for spec in TECHNIQUES])


def markdown() -> str:
    return reference.markdown(_own_keys())


def help_text() -> str:
    return reference.help_text(_own_keys())


if __name__ == "__main__":
    sys.stdout.write(markdown())
