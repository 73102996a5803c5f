"""IPython syntax in a lab cell, as the grader reads it: the cell magic, and plain Python.

``python_of(source)`` -> (cell magic, its argument, the cell as Python): a ``%line`` or
``!shell`` line becomes ``pass`` (lines keep their numbers); a ``%%magic arg`` first line
is taken off and named.
"""

from __future__ import annotations

__all__ = ["python_of"]


def python_of(source: str) -> tuple[str | None, str | None, str]:
    """(cell magic, its argument, the cell as Python): line magics become ``pass``."""
    lines = source.split("\n")
    magic = arg = None
    if lines and lines[0].startswith("%%"):
        words = lines[0][2:].split()
        magic, arg = (words[0] if words else ""), (words[1] if len(words) > 1 else None)
        lines = lines[1:]
    out = []
    for line in lines:
        stripped = line.lstrip()
        if stripped.startswith(("%", "!")):
            line = line[: len(line) - len(stripped)] + "pass"
        out.append(line)
    return magic, arg, "\n".join(out)
