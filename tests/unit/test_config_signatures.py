"""How many functions outside ``memfit.config``, ``memfit.cli`` and the top-level entry
points take the whole ``Config``.

A function handed the whole config does not say which options it reads, and a test must
build a whole config to call it. The number may only fall: lower ``CEILING`` to the count
printed when it does. The aim is at most 40, each part receiving only its own options.

The top-level entry points are what a user hands a whole config to: the commands' own
modules (the floor just below the CLI in test_layers.FLOORS: merge, generate, predict,
bench, report, environment) and the modules of ``memfit.train`` and ``memfit.plan``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from test_layers import FLOORS

import memfit

PACKAGE = Path(memfit.__file__).parent
EXEMPT = ("config", "cli")  # where the Config is read, built and written
ENTRY_POINTS = (*FLOORS[-3], "training/api.py", "plan/planner.py")
CEILING = 34  # counted on 2026-12-05 (61 with the entry points; 176 when this test came)


def _takes_config(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    arguments = function.args
    for argument in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs):
        if argument.annotation is not None:
            # "Config", "schema.Config" or a string annotation of either
            name = ast.unparse(argument.annotation).strip("'\"").rpartition(".")[2]
            if name == "Config":
                return True
    return False


def config_signatures() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if (relative.parts[0] in EXEMPT or relative.with_suffix("").parts[0] in ENTRY_POINTS
                or relative.as_posix() in ENTRY_POINTS):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _takes_config(node):
                found.append(f"{relative}:{node.lineno} {node.name}")
    return found


def test_the_functions_taking_the_whole_config_do_not_grow():
    found = config_signatures()
    assert len(found) <= CEILING, (
        f"{len(found)} functions outside memfit.config, memfit.cli and the entry points take "
        f"the whole Config "
        f"(at most {CEILING}); hand the new ones only the options they read:\n"
        + "\n".join(found))


def test_the_count_sees_every_spelling_of_the_annotation():
    source = ("def a(config: Config): ...\n"
              "def b(x: int, *, config: 'schema.Config'): ...\n"
              "def c(config: ConfigError): ...\n")
    functions = [node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)]
    assert [_takes_config(function) for function in functions] == [True, True, False]
