"""What a Python file imports, read statically: lazy imports inside functions and TYPE_CHECKING ones included."""

from __future__ import annotations

import ast
from pathlib import Path


def imported_names(path: Path) -> set[str]:
    """Every dotted name ``path`` imports (``from a.b import c`` gives ``a.b`` and ``a.b.c``), anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update([node.module, *(f"{node.module}.{alias.name}" for alias in node.names)])
    return found
