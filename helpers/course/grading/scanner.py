"""Read one learner cell's syntax tree and list what the guard will not run (helpers.course.grading.refusals).

``scan(source, policy)`` handles the IPython layer first (a ``%%program`` cell is
Python after its first line; a ``%%sbatch`` cell does not run under grading; other
magics and shell escapes are refused), then walks the tree with scopes, so that a
function's own local names may shadow anything while the notebook's names, modules
and builtins may not be rebound or changed.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import re
import sys

from IPython.core.inputtransformer2 import TransformerManager

from helpers.course.grading.refusals import (
    ALLOWED_DUNDERS,
    DUNDER,
    GRADER_ATTRIBUTES,
    GRADER_MODULES,
    GRADER_NAMES,
    SCANNED_MAGICS,
    UNRUN_MAGICS,
    Policy,
    Refusal,
)

__all__ = ["scan", "split_magic"]


def split_magic(source: str) -> tuple[str | None, str]:
    """(cell magic name or None, Python body with the magic line blanked: lines keep numbers)."""
    first, _, rest = source.partition("\n")
    m = re.match(r"^\s*%%(\w+)", first)
    if not m:
        return None, source
    return m.group(
        1
    ), "pass  # the magic line\n" + rest  # a statement: IPython drops empty first lines


def scan(source: str, policy: Policy | None = None) -> list[Refusal]:
    """Every refused construct of one cell's source, in line order ([] when it may run)."""
    policy = policy or Policy()
    magic, body = split_magic(source)
    if magic in UNRUN_MAGICS:
        return []
    if magic is not None and magic not in SCANNED_MAGICS:
        why = (
            f"runs its body as something other than checked Python; allowed cell magics: "
            f"{', '.join('%%' + m for m in sorted(SCANNED_MAGICS | UNRUN_MAGICS))}"
        )
        return [Refusal(1, f"%%{magic}", why)]
    try:
        python = TransformerManager().transform_cell(body)  # %magic, !shell -> get_ipython()
        tree = ast.parse(python)
    except SyntaxError:
        return []  # the kernel reports the syntax error itself, in the learner's words
    checker = _Checker(policy)
    checker.visit(tree)
    return sorted(checker.found, key=lambda r: r.line)


def _installed(top: str) -> bool:
    if top in sys.builtin_module_names or top in sys.modules:
        return True
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def _shown(node: ast.AST) -> str:
    """The expression as the learner wrote it (shortened)."""
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_magic_call(func: ast.AST) -> bool:
    return (
        isinstance(func, ast.Attribute)
        and func.attr in ("run_line_magic", "run_cell_magic", "system", "getoutput")
        and isinstance(func.value, ast.Call)
        and isinstance(func.value.func, ast.Name)
        and func.value.func.id == "get_ipython"
    )


def _prefix_match(module: str, table: dict[str, str]) -> str | None:
    for name in table:
        if module == name or module.startswith(name + "."):
            return name
    return None


IPYTHON_BUILTINS = {"display", "get_ipython", "__IPYTHON__", "dreload"}


class _Checker(ast.NodeVisitor):
    """Walks one cell; module-level bindings and function scopes are told apart."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.found: list[Refusal] = []
        self.scopes: list[set[str]] = []  # local names of the enclosing functions
        self.imported: set[str] = set(policy.lab_bindings)  # names bound to modules/imports
        self.module_of: dict[str, str] = dict(policy.lab_bindings)  # name -> dotted import
        self.refused_paths: set[tuple[int, str]] = set()  # (line, refused module) reported
        # Python's builtins, not what an IPython shell in this process adds to them (display,
        # get_ipython): the answer must not depend on where the guard runs.
        self.builtin_names = set(dir(builtins)) - IPYTHON_BUILTINS

    def refuse(self, node: ast.AST, construct: str, why: str, grader: bool = True) -> None:
        self.found.append(Refusal(getattr(node, "lineno", 1), construct, why, grader))

    # ---------------------------------------------------------------- imports
    def _check_module(self, node: ast.AST, module: str, shown: str) -> bool:
        parts = module.split(".")
        if (lab := _prefix_match(module, self.policy.lab_imports)) is not None:
            self.refuse(node, shown, self.policy.lab_imports[lab], grader=False)
            return False
        if (name := _prefix_match(module, GRADER_MODULES)) is not None:
            if not (name == "IPython" and module.startswith("IPython.display")):
                self.refuse(node, shown, f"{GRADER_MODULES[name]}; solution cells may not use it")
                return False
        if any(p.startswith("_") and not DUNDER.match(p) for p in parts):
            self.refuse(node, shown, "a private module (its name starts with '_'): "
                                     "use the public API")  # fmt: skip
            return False
        top = parts[0]
        if top in self.policy.shadowing:
            self.refuse(node, shown, f"a file {top}.py next to the notebook would be imported "
                                     "instead of the installed module: remove it")  # fmt: skip
            return False
        if top not in self.policy.programs and top != "__future__" and not _installed(top):
            self.refuse(node, shown, f"no installed module {top!r}: import only installed "
                                     "packages (torch, math, ...)")  # fmt: skip
            return False
        return True

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            shown = f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
            if self._check_module(node, alias.name, shown):
                bound = alias.asname or alias.name.split(".")[0]
                binding = alias.name if alias.asname else alias.name.split(".")[0]
                self.module_of[bound] = binding
                self._bind(node, bound, import_of=binding)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = "." * node.level + (node.module or "")
        if node.level:
            self.refuse(node, f"from {module} import ...", "a relative import: import "
                                                          "installed modules by name")  # fmt: skip
            return
        for alias in node.names:
            shown = f"from {module} import {alias.name}"
            if alias.name == "*":
                self.refuse(node, shown, "imports names you cannot see, which may replace the "
                                         "lab's own: import each name you use")  # fmt: skip
                continue
            if not self._check_module(node, f"{module}.{alias.name}", shown):
                continue
            self._name_allowed(node, alias.name, shown)
            self.module_of[alias.asname or alias.name] = f"{module}.{alias.name}"
            self._bind(node, alias.asname or alias.name, import_of=f"{module}.{alias.name}")

    # ---------------------------------------------------------------- names and bindings
    def _local(self, name: str) -> bool:
        return any(name in scope for scope in self.scopes)

    def _bind(self, node: ast.AST, name: str, import_of: str | None = None) -> None:
        if self.scopes:  # a function's local name: the notebook's namespace is untouched
            return
        if import_of is not None:
            self.imported.add(name)
            if self.policy.lab_bindings.get(name) == import_of:
                return  # the same import the lab's cells make
        if name in self.policy.protected or name in self.policy.lab_bindings:
            self.refuse(node, name, "a name the lab's own cells define, which its tests use: "
                                    "give yours another name")  # fmt: skip
        elif name in self.builtin_names:
            self.refuse(node, name, "replaces a Python builtin that the tests use too: "
                                    "give yours another name")  # fmt: skip

    def _name_allowed(self, node: ast.AST, name: str, construct: str | None = None) -> None:
        if name in GRADER_NAMES and not self._local(name):
            self.refuse(node, construct or name, GRADER_NAMES[name])
        elif DUNDER.match(name) and name not in ALLOWED_DUNDERS:
            self.refuse(node, construct or name, "a special name of the interpreter")
        elif name == "_get_current_dispatch_mode" or name.startswith("_c10d"):
            self.refuse(node, construct or name, "torch's dispatch internals, where the "
                                                 "tests record your collectives")  # fmt: skip

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self._name_allowed(node, node.id)
        else:
            if self.scopes:
                self.scopes[-1].add(node.id)
            self._bind(node, node.id)

    def visit_Global(self, node: ast.Global) -> None:
        for name in node.names:
            shared = self.policy.protected | set(self.policy.lab_bindings) | self.builtin_names
            if name in shared:
                self.refuse(node, f"global {name}", "rebinds a name the lab's own cells "
                                                    "define, which its tests use")  # fmt: skip
            for scope in self.scopes:
                scope.discard(name)

    # ---------------------------------------------------------------- attributes
    def _root(self, node: ast.AST) -> ast.Name | None:
        while isinstance(node, ast.Attribute | ast.Subscript):
            node = node.value
        return node if isinstance(node, ast.Name) else None

    def _refused_path(self, node: ast.Attribute) -> None:
        """``torch.distributed.optim.ZeroRedundancyOptimizer`` reaches a refused module
        without importing it (``import torch`` loaded it): refused as its import would be."""
        parts, base = [], node
        while isinstance(base, ast.Attribute):
            parts.append(base.attr)
            base = base.value
        if not isinstance(base, ast.Name) or base.id not in self.module_of:
            return
        dotted = ".".join([self.module_of[base.id], *reversed(parts)])
        lab = _prefix_match(dotted, self.policy.lab_imports)
        if lab is not None and (node.lineno, lab) not in self.refused_paths:
            self.refused_paths.add((node.lineno, lab))
            self.refuse(node, _shown(node), self.policy.lab_imports[lab], grader=False)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        attr = node.attr
        self._refused_path(node)
        root = self._root(node)
        on_module = root is not None and root.id in self.imported and not self._local(root.id)
        if attr in GRADER_ATTRIBUTES:
            self.refuse(node, f".{attr}", "leads to frames, code or the interpreter's "
                                          "internals")  # fmt: skip
        elif DUNDER.match(attr) and attr not in ALLOWED_DUNDERS:
            self.refuse(node, f".{attr}", "a special attribute of the interpreter (code, "
                                          "namespaces, classes): not needed for the lab")  # fmt: skip
        elif attr.startswith("_") and on_module and not attr.startswith("_foreach_"):
            self.refuse(node, _shown(node), "a private part of a module (its name "
                                                     "starts with '_'): use the public API")  # fmt: skip
        elif "dispatch_mode" in attr or attr.startswith("_c10d"):
            self.refuse(node, f".{attr}", "torch's dispatch internals, where the tests record "
                                          "your collectives")  # fmt: skip
        if not isinstance(node.ctx, ast.Load):
            self._changes_shared(node, root)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if not isinstance(node.ctx, ast.Load):
            self._changes_shared(node, self._root(node))
        self.generic_visit(node)

    def _changes_shared(self, node: ast.AST, root: ast.Name | None) -> None:
        if root is None or self._local(root.id):
            return
        if root.id in self.imported or root.id in self.policy.protected:
            self.refuse(node, ast.unparse(node), f"changes {root.id}, which the tests use "
                                                 "too (monkeypatching)")  # fmt: skip

    # ---------------------------------------------------------------- definitions and calls
    def _function(self, node, args: ast.arguments | None) -> None:
        names = set()
        if args is not None:
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            names = {a.arg for a in every if a is not None}
        self.scopes.append(names)
        body = node.body if isinstance(node.body, list) else [node.body]
        for stmt in body:  # bindings of the whole body count as local, as Python does
            for sub in ast.walk(stmt):
                if isinstance(sub, ast.Name) and not isinstance(sub.ctx, ast.Load):
                    names.add(sub.id)
                elif isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names.add(sub.name)
                elif isinstance(sub, ast.alias):
                    names.add(sub.asname or sub.name.split(".")[0])
        for stmt in body:
            self.visit(stmt)
        self.scopes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if DUNDER.match(node.name) and node.name not in ALLOWED_DUNDERS:
            self.refuse(node, f"def {node.name}", "this special method changes what Python's "
                        "operators or pickling do with your objects, the tests' checks "
                        "included: compute the answer instead")  # fmt: skip
        for deco in node.decorator_list:
            self.visit(deco)
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)
        self._bind(node, node.name)
        self._function(node, node.args)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)
        self._function(node, node.args)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for expr in [*node.bases, *node.decorator_list, *(k.value for k in node.keywords)]:
            self.visit(expr)
        self._bind(node, node.name)
        self.scopes.append(set())  # class bodies do not bind notebook names
        for stmt in node.body:
            self.visit(stmt)
        self.scopes.pop()

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if _is_magic_call(func):  # what IPython made of %magic or !shell
            kind, arg = func.attr, node.args[0].value if node.args else ""
            shown = f"!{arg}" if kind in ("system", "getoutput") else f"%{arg}"
            self.refuse(node, shown, "IPython syntax runs through the kernel, around the "
                                     "checks of your code: write plain Python")  # fmt: skip
            return
        if isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) >= 2:
            name = node.args[1]
            ok = isinstance(name, ast.Constant) and isinstance(name.value, str)
            if not ok or name.value.startswith("_"):
                self.refuse(node, "getattr", "reads an attribute by a computed or private "
                                             "name: write the attribute out")  # fmt: skip
        if isinstance(func, ast.Name) and func.id == "type" and len(node.args) == 3:
            self.refuse(node, "type(name, bases, namespace)", "makes a class whose methods no "
                                                              "check can see")  # fmt: skip
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        value = node.value
        if isinstance(value, str) and DUNDER.match(value) and value not in ALLOWED_DUNDERS:
            self.refuse(node, repr(value), "names a special attribute of the interpreter")
