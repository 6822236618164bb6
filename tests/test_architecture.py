"""The package's layering: imports point one way, down the layers, and no module imports itself in a cycle.

Counted from the source (function-level imports included), so a lazy import cannot hide an upward arrow.
"""

from __future__ import annotations

import ast
from pathlib import Path

import accumrun

PACKAGE = Path(accumrun.__file__).parent

# Top to bottom. A module may import its own unit and any unit of a lower layer, never one above or beside it.
LAYERS: list[set[str]] = [
    {"__main__"},
    {"cli"},
    {"__init__", "launcher"},
    {"reports", "training"},
    {"objective"},
    {"config"},
    {"models", "optim"},
    {"data"},
    {"rundir"},
    {"core", "lookup"},
    {"sections"},
    {"errors", "kinds", "_version", "stops"},
]


def _unit(module: str) -> str:
    """The layering unit of a dotted module name under accumrun: its subpackage, or its top-level module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer(unit: str) -> int:
    return next(index for index, units in enumerate(LAYERS) if unit in units)


def _imports() -> dict[str, set[str]]:
    """Every accumrun module and the accumrun modules it imports anywhere in its body."""
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(relative.parts).removesuffix(".__init__")
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "accumrun":
                targets.add(node.module)
            elif isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names if alias.name.split(".")[0] == "accumrun"}
        graph[name] = targets
    return graph


def test_every_unit_has_a_layer():
    units = {_unit(module) for module in _imports()}
    assert units <= set().union(*LAYERS), sorted(units - set().union(*LAYERS))


def test_imports_point_down_the_layers():
    upward = [
        f"{module} imports {target}"
        for module, targets in _imports().items()
        for target in targets
        if _unit(target) != _unit(module) and _layer(_unit(target)) <= _layer(_unit(module))
    ]
    assert upward == []


def test_no_import_cycles():
    imports = _imports()
    graph = {module: targets & set(imports) for module, targets in imports.items()}
    visiting, done, cycles = set(), set(), []

    def visit(module: str, trail: list[str]) -> None:
        if module in done:
            return
        if module in visiting:
            cycles.append(" -> ".join([*trail[trail.index(module) :], module]))
            return
        visiting.add(module)
        for target in sorted(graph[module]):
            visit(target, [*trail, module])
        visiting.discard(module)
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    assert cycles == []
