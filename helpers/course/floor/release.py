"""The public API surface of a PyTorch release, read from its Python sources and stubs.

Two sets describe a release without importing it:

* ``modules``: for each module (``torch.distributed``, ``torch.backends.cudnn``...), the names it
  defines or imports at top level, with ``from x import *`` followed, ``__all__``, annotations
  (``enabled: bool`` of a module replaced by an object) and the names a module-level
  ``__getattr__`` answers by string;
* ``attributes``: every attribute or method name defined anywhere (``def``, class attributes,
  ``self.x = ...``, ``__slots__``, names that a ``__getattr__``/``__setattr__`` compares with),
  and every attribute name the release's own code reads (a name torch itself reads existed
  then, on some object: C methods without stubs, Python's own types).

``python -m helpers.course.floor build-manifest WHEEL`` writes them for the floor's wheel
(helpers/course/floor/torch-2.6.json.gz); ``helpers.course.floor.check`` checks the workbook against them.
"""

from __future__ import annotations

import ast
import gzip
import json
import re
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

__all__ = [
    "MANIFEST",
    "Release",
    "attribute_names",
    "module_name",
    "read_sources",
    "release_from_sources",
    "wheel_release",
]

MANIFEST = Path(__file__).with_name("torch-2.6.json.gz")  # the floor's (helpers.compat.FLOOR)
_IDENT = re.compile(r"^[A-Za-z_]\w*$")
_ATTR_HOOKS = {"__getattr__", "__getattribute__", "__setattr__", "__dir__"}
# torch/__init__.py copies every name of torch._C._VariableFunctions into its globals in a loop
_COPIED_INTO = {"torch": ["torch._C._VariableFunctions"]}


def module_name(path: str) -> str | None:
    """'torch/nn/__init__.py' -> 'torch.nn'; None for files that are not modules."""
    if not path.endswith((".py", ".pyi")):
        return None
    parts = path.rsplit(".", 1)[0].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) if all(_IDENT.match(p) for p in parts) else None


def read_sources(files: Iterable[tuple[str, bytes]]) -> dict[str, tuple[ast.Module, bool]]:
    """{module: (tree, is a package)} for ("torch/x/y.py", text) pairs; a .pyi stub's names join
    its module's."""
    trees: dict[str, list[ast.Module]] = {}
    packages = set()
    for path, text in files:
        name = module_name(path)
        if name is None or not name.startswith("torch"):
            continue
        try:
            trees.setdefault(name, []).append(ast.parse(text))
        except (SyntaxError, ValueError):
            continue  # a template or a file for another Python
        if path.rsplit("/", 1)[-1].startswith("__init__."):
            packages.add(name)
    return {
        name: (ast.Module(body=[s for t in ts for s in t.body], type_ignores=[]), name in packages)
        for name, ts in trees.items()
    }


def _compared_strings(fn: ast.AST) -> set[str]:
    """Identifier-like strings a __getattr__-like function compares with or looks up."""
    found = set()
    for node in ast.walk(fn):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _IDENT.match(node.value)
        ):
            found.add(node.value)
    return found


def _targets(node: ast.AST) -> Iterator[ast.AST]:
    if isinstance(node, ast.Assign):
        yield from node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        yield node.target


def _names_in(target: ast.AST) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for t in target.elts:
            yield from _names_in(t)


def _strings(node: ast.AST | None) -> set[str]:
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return {
            e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
        }
    return set()


def _top_level(tree: ast.Module, package: str) -> tuple[set[str], set[str], list[str]]:
    """(names, __all__ names, modules star-imported) of a module's top level (if/try included);
    ``package``: the package that relative imports start from."""
    names, listed, stars = set(), set(), []
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                stack.extend(getattr(node, field, []))
        elif isinstance(node, ast.ExceptHandler):
            stack.extend(node.body)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if node.name == "__getattr__":
                names |= _compared_strings(node)
        elif isinstance(node, ast.Import):
            names |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            for a in node.names:
                if a.name == "*":
                    stars.append(base)
                else:
                    names.add(a.asname or a.name)
        else:
            for target in _targets(node):
                names.update(_names_in(target))
                if isinstance(target, ast.Name) and target.id == "__all__":
                    listed |= _strings(node.value)
            if isinstance(node, ast.Expr) and isinstance(
                node.value, ast.Call
            ):  # __all__.extend([...])
                f = node.value.func
                if (
                    isinstance(f, ast.Attribute)
                    and getattr(f.value, "id", "") == "__all__"
                    and node.value.args
                ):
                    listed |= _strings(node.value.args[0])
    return names | listed, listed, stars


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = parts[: len(parts) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def attribute_names(tree: ast.AST) -> set[str]:
    """Every attribute or method name a source defines (see the module docstring)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
            if node.name in _ATTR_HOOKS:
                found |= _compared_strings(node)
            if isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    for target in _targets(stmt):
                        found.update(_names_in(target))
                        if isinstance(target, ast.Name) and target.id == "__slots__":
                            found |= _strings(stmt.value)
        for target in _targets(node):
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute):
                    found.add(t.attr)
    return found


def _used(tree: ast.AST) -> set[str]:
    """Attribute names a release's own code reads: names of C methods without stubs
    (``Tensor._make_wrapper_subclass``), of Python's types (``str.partition``)."""
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}


def _signature(fn: ast.AST) -> set[str]:
    """A def's parameter names, "**" when it takes any keyword."""
    a = fn.args
    names = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
    return names | ({"**"} if a.kwarg else set())


def parameters(tree: ast.Module, module: str) -> dict[str, set[str]]:
    """{public function or class name: its keyword names} of one module's top level: a class's
    from its ``__init__`` (or its annotated fields, a dataclass's)."""
    if "._internal" in module or module.startswith("torch._"):
        return {}
    out: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith(
            "_"
        ):
            out.setdefault(node.name, set()).update(_signature(node))
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            inits = [
                f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"
            ]
            fields = {
                t.target.id
                for t in node.body
                if isinstance(t, ast.AnnAssign) and isinstance(t.target, ast.Name)
            }
            if inits or fields:
                out.setdefault(node.name, set()).update(fields, *(_signature(f) for f in inits))
    return out


class Release:
    """A torch release's modules {name: top-level names}, its attribute names and the keyword
    names of its public functions and classes, by name (every module's that defines it)."""

    def __init__(self, modules: dict[str, set[str]], attributes: set[str], version: str = "?",
                 params: dict[str, set[str]] | None = None):  # fmt: skip
        self.modules, self.attributes, self.version = modules, attributes, version
        self.params = params or {}

    def has(self, module: str, name: str) -> bool:
        """Does ``module.name`` exist: a top-level name, or a submodule?"""
        return name in self.modules.get(module, ()) or f"{module}.{name}" in self.modules

    def to_json(self) -> dict:
        return {"version": self.version, "attributes": sorted(self.attributes),
                "modules": {m: sorted(n) for m, n in sorted(self.modules.items())},
                "params": {f: sorted(n) for f, n in sorted(self.params.items())}}  # fmt: skip

    def save(self, path: Path = MANIFEST) -> None:
        text = json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True)
        path.write_bytes(gzip.compress(text.encode(), mtime=0))  # the same wheel, the same bytes

    @classmethod
    def load(cls, path: Path = MANIFEST) -> Release:
        data = json.loads(gzip.decompress(path.read_bytes()))
        return cls(
            {m: set(n) for m, n in data["modules"].items()},
            set(data["attributes"]),
            data["version"],
            {f: set(n) for f, n in data.get("params", {}).items()},
        )


def release_from_sources(trees: dict[str, tuple[ast.Module, bool]], version: str = "?") -> Release:
    """The Release of a read_sources map, star imports followed."""
    tops = {
        m: _top_level(t, m if package else m.rpartition(".")[0])
        for m, (t, package) in trees.items()
    }

    def exported(module: str, seen: frozenset = frozenset()) -> set[str]:
        if module not in tops or module in seen:
            return set()
        names, listed, stars = tops[module]
        out = set(listed) if listed else {n for n in names if not n.startswith("_")}
        for star in stars:
            out |= exported(star, seen | {module})
        return out

    modules = {}
    for m, (names, _, stars) in tops.items():
        modules[m] = set(names).union(*(exported(s) for s in stars))
        for source in _COPIED_INTO.get(m, []):
            modules[m] |= tops.get(source, (set(),))[0]
    attributes = set().union(
        *(attribute_names(t) | _used(t) for t, _ in trees.values()), *modules.values()
    )
    params: dict[str, set[str]] = {}  # by name, and by the module that defines it
    for m, (t, _) in trees.items():
        for name, names in parameters(t, m).items():
            params.setdefault(name, set()).update(names)
            params[f"{m}.{name}"] = set(names)
    return Release(modules, attributes, version, params)


def wheel_release(wheel: Path) -> Release:
    """The Release of a torch wheel file, read without installing it."""
    with zipfile.ZipFile(wheel) as z:
        files = [
            (n, z.read(n))
            for n in z.namelist()
            if n.startswith("torch/") and n.endswith((".py", ".pyi"))
        ]
        meta = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
        version = "?"
        if meta:
            version = re.search(r"^Version: (\S+)", z.read(meta).decode(), re.M).group(1)
    return release_from_sources(read_sources(files), version)
