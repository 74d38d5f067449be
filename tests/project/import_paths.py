"""What the project's own import rules (test_house_rules.py, test_import_graph.py) both need:
the absolute module a relative ``from ... import`` names."""
from __future__ import annotations

import ast


def from_module(here: str, node: ast.ImportFrom) -> str:
    """The absolute module ``node`` imports from, written in a module whose package is ``here``
    (``from . import x`` in ``a.b.c`` -> ``a.b``; ``from ..d import y`` -> ``a.d``)."""
    if not node.level:
        return node.module or ""
    base = here.split(".")
    base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join(base + ([node.module] if node.module else []))
