"""docs/config.md and ``memfit train --help``'s list of keys: the schema's
(memfit.config.reference) with every optimizer's own keys (their specs' option blocks),
each generated from where it is declared.
``python -m memfit.techniques.config_reference > docs/config.md``; a test keeps it in sync.
"""

from __future__ import annotations

import sys

from memfit.config import reference
from memfit.techniques.optimizers.own_options import own_key_docs
from memfit.techniques.optimizers.registry import SPECS


def markdown() -> str:
    return reference.markdown(own_key_docs(SPECS.values()))


def help_text() -> str:
    return reference.help_text(own_key_docs(SPECS.values()))


if __name__ == "__main__":
    sys.stdout.write(markdown())
