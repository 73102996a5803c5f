"""The learner's own modules that a job program imports, so the job carries them along.

A lab writes a solution cell to ``programs/ring.py`` (``%%program ring``) and a
driver to ``programs/ring_bench.py`` that says ``from ring import ...``. The job
runs a *copy* of the driver in its run directory, so the modules it imports from
its own folder are copied there too: the run directory is then a snapshot of
exactly the code that ran, and a later edit of the solution cannot change it.
"""

from __future__ import annotations

import ast
from pathlib import Path

__all__ = ["sibling_imports"]


def _imported_names(source: str, filename: str) -> set[str]:
    """Top-level module names a program imports (``import a.b`` and ``from a import b``: 'a')."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as e:
        raise SyntaxError(f"{filename} line {e.lineno}: {e.msg} (fix the cell, then submit)") from e
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def sibling_imports(program: Path) -> dict[str, str]:
    """{file name: source} of the modules beside ``program`` that it imports, transitively."""
    program = Path(program)
    found: dict[str, str] = {}
    todo = [program.read_text()]
    names_seen: set[str] = set()
    while todo:
        source = todo.pop()
        for name in sorted(_imported_names(source, str(program)) - names_seen):
            names_seen.add(name)
            path = program.parent / f"{name}.py"
            if path.is_file() and path != program:
                found[path.name] = path.read_text()
                todo.append(found[path.name])
    return found
