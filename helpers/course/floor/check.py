"""The version floor, checked: every torch name the workbook runs must exist in the floor's torch.

The check is differential and static, so CI tests the floor without installing a second
torch: a name fails when the installed torch has it and the floor's release does not
(helpers/course/floor/torch-2.6.json.gz, read from its wheel by helpers.course.floor.release).
It reads what a learner or a job runs (helpers.course.floor.sources) and follows torch's
modules through aliases (``import torch.distributed as tdist; tdist.all_gather_single``),
``from torch.x import y``, ``getattr(x, "name")``, attribute or method names called on objects
(``model.set_reduce_scatter_max_input_buffers(2)``) and the keywords passed to torch's
module-level functions and classes (``DDP(m, forward_sync_buffers=False)``).

helpers/compat.py, the one module allowed to name both releases, is not read; a line that must
name a newer API (behind a version test of its own) says why with ``# floor: ok (reason)``.

    python -m helpers.course.floor check                  # the offences, one a line
    python -m helpers.course.floor build-manifest WHEEL   # rewrite the floor's manifest
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from helpers import compat
from helpers.course.floor import release as floor_release
from helpers.course.floor.sources import ROOT, Source, workbook_sources

__all__ = ["GUARD", "Offence", "check", "main"]

GUARD = re.compile(r"#\s*floor:\s*ok\s*\(.+\)")


@dataclass(frozen=True)
class Offence:
    where: str
    line: int
    name: str  # "torch.distributed.all_gather_single" or ".set_reduce_scatter_max_input_buffers"
    code: str  # the source line

    def __str__(self) -> str:
        if self.name.startswith("("):
            return f"{self.where}, line {self.line}: {self.name}\n    {self.code.strip()}"
        use = compat.REPLACES.get(self.name) or compat.REPLACES.get(self.name.rpartition(".")[2])
        fix = (
            f"use helpers.compat.{use}"
            if use
            else "add a function to helpers/compat.py that works on both"
        )
        return (
            f"{self.where}, line {self.line}: {self.name} is not in torch {compat.FLOOR}, the workbook's floor: "
            f"{fix}, or mark the line `# floor: ok (reason)`\n    {self.code.strip()}"
        )


class _Reader(ast.NodeVisitor):
    """The torch names one source uses: ``paths`` (dotted, from a torch module) and ``bare``
    (attribute names on objects), each with its line."""

    def __init__(self, aliases: dict[str, str | None]):
        self.aliases = aliases  # local name -> dotted torch path, or None for another library
        self.paths: list[tuple[int, list[str]]] = []
        self.bare: list[tuple[int, str]] = []
        self.calls: list[tuple[int, list[str], list[str]]] = []  # torch calls with keywords
        # attribute names that argparse makes: add_argument("--dry-run") -> args.dry_run
        self.own: set[str] = set()

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            top = a.name.split(".")[0]
            if a.asname:
                self.aliases[a.asname] = a.name if top == "torch" else None
            else:
                self.aliases[top] = top if top == "torch" else None
            if top == "torch":
                self.paths.append((node.lineno, a.name.split(".")))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        for a in node.names:
            if module.split(".")[0] == "torch" and not node.level and a.name != "*":
                self.aliases[a.asname or a.name] = f"{module}.{a.name}"
                self.paths.append((node.lineno, f"{module}.{a.name}".split(".")))
            elif a.name != "*":
                self.aliases[a.asname or a.name] = None

    def _chain(self, node: ast.AST) -> list[str] | None:
        """['tdist', 'all_gather_single'] for tdist.all_gather_single; None if not names only."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None

    def _use(self, line: int, chain: list[str]) -> None:
        root = chain[0]
        if root in self.aliases:
            if self.aliases[root]:
                self.paths.append((line, self.aliases[root].split(".") + chain[1:]))
            return  # another library's names are not torch's
        self.bare.extend((line, name) for name in chain[1:])

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain = self._chain(node)
        if chain:
            self._use(node.lineno, chain)
        else:
            self.bare.append((node.lineno, node.attr))
            self.visit(node.value)

    def visit_Call(self, node: ast.Call) -> None:
        f, args = node.func, node.args
        chain, keywords = self._chain(f), [k.arg for k in node.keywords if k.arg]
        if chain and keywords and self.aliases.get(chain[0]):
            self.calls.append(
                (node.lineno, self.aliases[chain[0]].split(".") + chain[1:], keywords)
            )
        for k in node.keywords:
            if k.arg == "dest" and isinstance(k.value, ast.Constant):
                self.own.add(k.value.value)
        if isinstance(f, ast.Attribute) and f.attr == "add_argument":
            self.own |= {
                a.value.lstrip("-").replace("-", "_") for a in args if isinstance(a, ast.Constant)
            }
        named = (
            len(args) >= 2 and isinstance(args[1], ast.Constant) and isinstance(args[1].value, str)
        )
        if isinstance(f, ast.Name) and f.id in ("getattr", "hasattr", "setattr") and named:
            chain = self._chain(args[0])
            if chain:
                self._use(node.lineno, [*chain, args[1].value])
            else:
                self.bare.append((node.lineno, args[1].value))
        self.generic_visit(node)


class _Installed:
    """The installed (newer) torch, asked only about names the floor lacks."""

    def __init__(self):
        import torch

        self.dir = Path(torch.__file__).parent
        self.modules = {
            floor_release.module_name(str(p.relative_to(self.dir.parent)))
            for p in self.dir.rglob("*.py*")
            if p.suffix in (".py", ".pyi")
        }

    def has(self, module: str, name: str) -> bool:
        if f"{module}.{name}" in self.modules:
            return True
        try:
            return hasattr(importlib.import_module(module), name)
        except Exception:  # a module that does not import here (another platform's)
            return False

    def defined_at(self, path: list[str]) -> str:
        """'module.name' where the function or class at ``path`` is defined here ('' if unknown):
        ``torch.distributed.checkpoint.load`` is ``...checkpoint.state_dict_loader.load``."""
        try:
            obj = self._resolve(path)
            return f"{obj.__module__}.{obj.__qualname__}"
        except Exception:  # not found, or no module (a C function)
            return ""

    def _resolve(self, path: list[str]):
        for cut in range(len(path), 0, -1):
            if ".".join(path[:cut]) in self.modules:
                break
        obj = importlib.import_module(".".join(path[:cut]))
        for part in path[cut:]:
            obj = getattr(obj, part)
        return obj

    def accepts(self, path: list[str], keyword: str) -> bool:
        """Does the function or class at ``path`` take ``keyword`` here?"""
        import inspect

        try:
            return keyword in inspect.signature(self._resolve(path)).parameters
        except Exception:  # not found, or no signature (a C function): not checked
            return False

    def defines(self, names: set[str]) -> set[str]:
        """Which of ``names`` torch's sources define as an attribute or method: grep for lines
        that look like a definition, then parse those files."""
        if not names:
            return set()
        any_ = "(" + "|".join(sorted(names)) + ")"
        pattern = rf"(def|class) {any_}\b|\.{any_}\s*(:[^=]*)?=[^=]|^\s*{any_}\s*(:[^=]*)?=[^=]|[\"']{any_}[\"']"
        found = subprocess.run(
            ["grep", "-rlE", "--include=*.py", "--include=*.pyi", pattern, str(self.dir)],
            capture_output=True, text=True,
        ).stdout.split()  # fmt: skip
        defined = set()
        for path in found:
            try:
                defined |= floor_release.attribute_names(ast.parse(Path(path).read_bytes()))
            except (SyntaxError, ValueError):
                continue
        return names & defined


@cache
def _not_torch() -> frozenset[str]:
    """Attribute names of Python's own types and of the other libraries' objects the workbook
    reads in files that also use torch (matplotlib's axes and figures)."""
    import collections
    import io
    import pathlib
    import subprocess as sp
    import symtable
    import types

    kinds = [str, bytes, list, dict, set, frozenset, int, float, tuple, object, type, BaseException,
             types.FunctionType, types.MethodType, types.ModuleType, pathlib.Path, io.TextIOWrapper,
             sp.Popen, symtable.SymbolTable, symtable.Symbol, collections.namedtuple("T", "a")]  # fmt: skip
    kinds += [c for c in vars(ast).values() if isinstance(c, type) and issubclass(c, ast.AST)]
    try:
        from matplotlib.axes import Axes
        from matplotlib.figure import Figure

        kinds += [Axes, Figure]
    except ImportError:
        pass
    return frozenset(n for k in kinds for n in [*dir(k), *getattr(k, "_fields", ())])


def _path_offence(
    chain: list[str], floor: floor_release.Release, now: _Installed
) -> tuple[str, list[str]]:
    """(the first dotted name the floor lacks, or '', the attribute names after the modules)."""
    module = chain[0]
    for i, part in enumerate(chain[1:], 1):
        if f"{module}.{part}" in now.modules:
            if not floor.has(module, part):
                return f"{module}.{part}", []
            module = f"{module}.{part}"
            continue
        dunder = part.startswith("__")  # __file__, __version__: every module's
        if dunder or floor.has(module, part) or not now.has(module, part):
            return "", chain[i + 1 :]
        return f"{module}.{part}", []
    return "", []


@cache
def _installed() -> _Installed:
    return _Installed()


@cache
def _floor() -> floor_release.Release:
    return floor_release.Release.load()


def check(sources: list[Source], floor: floor_release.Release | None = None) -> list[Offence]:
    """Every torch name ``sources`` use that the installed torch has and the floor lacks.

    A dotted name from a torch module is checked against that module in both releases; an
    attribute name on an object only in a file (or notebook) that imports torch, and only when
    neither the workbook nor Python's types nor matplotlib define it."""
    floor = floor or _floor()
    now, found, bare, own = _installed(), [], [], set()
    readers: dict[str, _Reader] = {}
    for s in sources:
        try:
            tree = ast.parse(s.text)
        except SyntaxError as e:  # it runs on no torch: say so rather than skip it
            found.append(
                (s, e.lineno or 1, f"(a syntax error on Python {sys.version.split()[0]}: {e.msg})")
            )
            continue
        own |= floor_release.attribute_names(tree)
        file = s.where.split(" cell ")[0]  # a notebook's cells share their names
        reader = readers.setdefault(file, _Reader({}))
        reader.paths, reader.bare, reader.calls = [], [], []
        reader.visit(tree)
        for line, chain in reader.paths:
            name, rest = _path_offence(chain, floor, now)
            if name:
                found.append((s, line, name))
            bare.extend((s, line, n, file) for n in rest)
        bare.extend((s, line, n, file) for line, n in reader.bare)
        for line, path, keywords in reader.calls:
            # the floor's keywords of the function defined where this torch defines it; else of
            # every function of that name (a "**" among them then hides a keyword)
            known = floor.params.get(now.defined_at(path)) or floor.params.get(path[-1])
            module_level = ".".join(path[:-1]) in now.modules  # a method's keywords are not read
            for k in keywords if module_level and known and "**" not in known else ():
                if k not in known and now.accepts(path, k):
                    found.append((s, line, f"{'.'.join(path)}({k}=...)"))
    uses_torch = {f for f, r in readers.items() if any(v for v in r.aliases.values())}
    own |= set().union(*(r.own for r in readers.values()))
    skip = floor.attributes | own | _not_torch()
    bare = [(s, line, n) for s, line, n, f in bare if f in uses_torch and n not in skip]
    newer = now.defines({n for _, _, n in bare})
    found += [(s, line, "." + n) for s, line, n in bare if n in newer]
    out = []
    for s, line, name in sorted(set(found), key=lambda f: (f[0].where, f[1], f[2])):
        code = s.text.splitlines()[line - 1]
        if not GUARD.search(code):
            out.append(Offence(s.where, line, name, code))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m helpers.course.floor", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="list every torch name the workbook uses that the floor lacks")
    build = sub.add_parser(
        "build-manifest", help=f"rewrite {floor_release.MANIFEST.name} from the floor's wheel"
    )
    build.add_argument("wheel", type=Path)
    args = parser.parse_args(argv)
    if args.command == "build-manifest":
        release = floor_release.wheel_release(args.wheel)
        release.save()
        print(
            f"torch {release.version}: {len(release.modules)} modules, {len(release.attributes)} names -> {floor_release.MANIFEST}"
        )
        return 0
    offences = check(workbook_sources(ROOT))
    for o in offences:
        print(o)
    print(f"{len(offences)} name(s) newer than torch {compat.FLOOR}")
    return 1 if offences else 0
