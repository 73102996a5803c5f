"""Benchmarks that print figures: ``python -m helpers.course.bench NAME [--option value]``.

Each NAME is a module of this package with ``main(argv)``; it prints a table of
figures measured on this machine and what changes on GPUs. Nothing here asserts
a speed (timed tests flake); the notebooks and the README quote these tables.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def names() -> list[str]:
    """Every benchmark: the modules of this package."""
    return sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    known = names()
    if not argv or argv[0] not in known:
        raise SystemExit(
            f"usage: python -m helpers.course.bench {{{','.join(known)}}} [--option value ...]"
        )
    importlib.import_module(f"{__name__}.{argv[0]}").main(argv[1:])
