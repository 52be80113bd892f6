"""What a Python file imports, read statically: lazy imports inside functions and TYPE_CHECKING ones included."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers.project import REPO


def imported_names(path: Path) -> set[str]:
    """Every dotted name ``path`` imports (``from a.b import c`` gives ``a.b`` and ``a.b.c``), anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update([node.module, *(f"{node.module}.{alias.name}" for alias in node.names)])
    return found


PACKAGES = ("tfdist", "tfdist_cli", "stages")


def module_file(name: str) -> Path | None:
    """The project file of module ``name`` (``tfdist.data.prepared`` -> src/tfdist/data/prepared.py), else None."""
    parts = name.split(".")
    if parts[0] not in PACKAGES:
        return None
    base = REPO / ("" if parts[0] == "stages" else "src") / Path(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(path: Path) -> set[str]:
    """Every project module ``path`` imports, anywhere in it, with the packages it passes through."""
    found: set[str] = set()
    for name in imported_names(path):
        parts = name.split(".")
        found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {name for name in found if module_file(name)}


def reachable_files(script: Path) -> set[str]:
    """The script and every project file it can import, transitively, relative to the repo."""
    seen, todo = {script}, [script]
    while todo:
        for name in imported_modules(todo.pop()):
            path = module_file(name)
            if path not in seen:
                seen.add(path)
                todo.append(path)
    return {str(path.relative_to(REPO)) for path in seen}
