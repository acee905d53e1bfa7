"""memfit's layers, read from the code: every import of src/memfit (function-local and
TYPE_CHECKING imports included) goes down a floor or stays inside its package, the modules
of one package import each other without a circle, and no source file is over 500 lines.

FLOORS is the one list of floors; docs/architecture.md draws it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "src" / "memfit"

# Bottom -> top. A package may import packages on lower floors only; the packages of one
# floor do not import each other. "__init__" and "__main__" are memfit/__init__.py and
# memfit/__main__.py; `python -m memfit` runs cli, so __main__ sits on a floor above it.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("_utils",),
    ("config",),
    ("accounting", "demo"),
    ("data",),
    ("models",),
    ("monitor",),
    ("optim",),
    ("distributed",),
    ("techniques",),
    ("checkpoint",),
    ("plan",),
    ("training",),
    ("merge", "generate", "predict", "bench", "report", "environment"),
    ("cli", "__init__"),
    ("__main__",),
)
FLOOR = {package: level for level, packages in enumerate(FLOORS) for package in packages}
MAX_LINES = 500


@dataclass(frozen=True)
class Import:
    source: str  # dotted module importing ("memfit.config.load")
    target: str  # dotted module imported ("memfit.techniques.registry")
    where: str  # "config/load.py:12"


def module_name(path: Path) -> str:
    parts = ("memfit", *path.relative_to(SOURCE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 2 else parts)


def is_module(dotted: str) -> bool:
    relative = Path(*dotted.split(".")[1:])
    return (SOURCE / relative).with_suffix(".py").is_file() or (SOURCE / relative).is_dir()


def package_of(dotted: str) -> str:
    """The floor-list name of a memfit module: its first part below memfit, or "__init__"
    for memfit itself."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_of(path: Path) -> list[Import]:
    """Every memfit module ``path`` imports, wherever the import statement sits."""
    source = module_name(path)
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        where = f"{path.relative_to(SOURCE)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [Import(source, alias.name, where) for alias in node.names
                      if alias.name.split(".")[0] == "memfit"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the importing module's package, up level - 1
                base = source.split(".")[: len(source.split(".")) - node.level + is_package]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "memfit":
                continue
            # "from memfit.techniques import registry" imports the module registry.
            found += [Import(source, f"{module}.{alias.name}"
                             if is_module(f"{module}.{alias.name}") else module, where)
                      for alias in node.names]
    return found


def all_imports() -> list[Import]:
    return [found for path in sorted(SOURCE.rglob("*.py")) for found in imports_of(path)]


def test_every_package_has_a_floor():
    packages = {package_of(module_name(path)) for path in SOURCE.rglob("*.py")}
    assert packages <= set(FLOOR), f"not in FLOORS: {sorted(packages - set(FLOOR))}"


def test_no_import_runs_up_a_floor_or_across_one():
    wrong = []
    for found in all_imports():
        low, high = package_of(found.source), package_of(found.target)
        if low == high:
            continue
        if FLOOR[high] > FLOOR[low]:
            wrong.append(f"{found.where}: {low} (floor {FLOOR[low]}) imports {found.target}, "
                         f"a higher floor ({high}, floor {FLOOR[high]})")
        elif FLOOR[high] == FLOOR[low]:
            wrong.append(f"{found.where}: {low} imports {found.target}, on its own floor "
                         f"({high}, floor {FLOOR[high]})")
    assert not wrong, "\n".join(wrong)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The circles of a directed graph, one per strongly connected component of more than
    one module (or a module importing itself), each as the modules on it, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in edges.get(node, ()):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in edges.get(node, ()):
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_cycles_finds_a_circle_and_only_circles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_inside_a_package():
    edges: dict[str, set[str]] = {}
    where: dict[tuple[str, str], str] = {}
    for found in all_imports():
        if package_of(found.source) == package_of(found.target) != "__init__":
            edges.setdefault(found.source, set()).add(found.target)
            where.setdefault((found.source, found.target), found.where)
    circles = []
    for circle in cycles(edges):
        lines = [where[(a, b)] + f" imports {b}" for a in circle for b in sorted(edges[a])
                 if b in circle]
        circles.append(f"circle {' <-> '.join(circle)}: " + "; ".join(lines))
    assert not circles, "\n".join(circles)


def test_no_source_file_over_500_lines():
    long = [f"{path.relative_to(SOURCE)}: {count} lines"
            for path in sorted(SOURCE.rglob("*.py"))
            if (count := len(path.read_text().splitlines())) > MAX_LINES]
    assert not long, f"over {MAX_LINES} lines: " + ", ".join(long)


ARCHITECTURE = SOURCE.parents[1] / "docs" / "architecture.md"


def drawn_packages() -> list[str]:
    """The packages docs/architecture.md's first drawing names at the start of its lines,
    top to bottom ("training/", "merge.py generate.py ...")."""
    text = ARCHITECTURE.read_text()
    drawing = text.split("```")[1]
    names = []
    for line in drawing.splitlines():
        if line[:1] == " " and line[1:2] not in (" ", "─", ""):
            for word in line.split("  ")[0].split():
                name = word.removesuffix("/").removesuffix(".py")
                names += [name] if name in FLOOR else []
    return names


def test_docs_architecture_draws_every_floor_top_down():
    drawn = drawn_packages()
    assert set(drawn) == set(FLOOR) - {"__init__"}  # memfit/__init__.py sits beside cli/
    floors = [FLOOR[name] for name in drawn]
    assert floors == sorted(floors, reverse=True), (
        f"docs/architecture.md draws the floors out of order: {drawn}; FLOORS: {FLOORS}")
