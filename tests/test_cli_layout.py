"""The command line's layout: click at the edge (``cli/``, and ``errors.py`` whose exceptions carry exit codes),
and each command in a module of its own, named after it."""

from __future__ import annotations

import ast
from pathlib import Path

import accumrun
from accumrun.cli import main

PACKAGE = Path(accumrun.__file__).parent


def _imports_click(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "click" for alias in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "click":
            return True
    return False


def test_click_is_imported_only_by_the_command_line_and_the_errors() -> None:
    importers = {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if _imports_click(path)}
    assert {name for name in importers if not name.startswith("cli/")} == {"errors.py"}


def test_each_command_is_a_module_of_its_own_named_after_it() -> None:
    modules = {name: command.callback.__module__ for name, command in main.commands.items() if command.callback}
    assert modules == {name: f"accumrun.cli.{name.replace('-', '_')}" for name in main.commands}
