"""The modules a lab refuses, made absent from its sandbox: where their files are, and the tests'
functions that come from them.

``module_files(names)`` -> [[module, path], ...]: every file or package directory that
would give the module to an import, found on the grader's own path (the sandbox's is the
same) under every import root where a copy sits (a checkout and an installed copy alike).
The sandboxed job covers each (helpers.course.grading.sandbox.jail).

``sent_by_value(names)``: while a test's function is pickled for the ranks, the refused
workbook modules the grader itself loaded are pickled by value, not by name, so a rank
never needs to import a module its sandbox does not have (lab 6's tests run
``ddp_check._on_ranks`` on the ranks; ``ddp_check`` is the tests' reference, refused).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

__all__ = ["module_files", "sent_by_value"]


def _locations(name: str) -> list[Path]:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:  # a package: its directory
        return [Path(p) for p in spec.submodule_search_locations]
    if spec.origin and spec.has_location:
        return [Path(spec.origin)]
    return []  # built into the interpreter: nothing on disk


def _roots() -> list[Path]:
    """The grader's import roots and the sandbox's (the directory that holds ``helpers``)."""
    paths = [Path(p or ".") for p in sys.path] + [Path(__file__).resolve().parents[4]]
    return list(dict.fromkeys(p.resolve() for p in paths if p.is_dir()))


def module_files(names: Iterable[str]) -> list[list[str]]:
    """[[module, path], ...] for every copy of each module on the import path (found once
    per set of names: a lab's direct calls ask for it thousands of times)."""
    return [list(pair) for pair in _files(frozenset(names))]


@functools.lru_cache(maxsize=64)
def _files(names: frozenset[str]) -> tuple[tuple[str, str], ...]:
    out, roots = [], _roots()
    for name in sorted(names):
        for found in _locations(name):
            found = found.resolve()
            out.append([name, str(found)])
            for root in sorted(roots, key=lambda r: -len(r.parts)):  # the innermost root
                if root in found.parents:
                    rel = found.relative_to(root)
                    out += [[name, str(r / rel)] for r in roots if (r / rel).exists()]
                    break
    return tuple(dict.fromkeys(tuple(pair) for pair in out))


@contextlib.contextmanager
def sent_by_value(names: Iterable[str]) -> Iterator[None]:
    """cloudpickle sends the functions of these (workbook) modules by value meanwhile."""
    import cloudpickle

    loaded = [
        sys.modules[n] for n in sorted(set(names)) if n.startswith("helpers.") and n in sys.modules
    ]
    for module in loaded:
        cloudpickle.register_pickle_by_value(module)
    try:
        yield
    finally:
        for module in loaded:
            with contextlib.suppress(ValueError):
                cloudpickle.unregister_pickle_by_value(module)
