"""A lab notebook as data: what the grader runs itself, and what only the sandbox may run.

nbgrader has restored the lab's own cells (locked and graded ones) before grading, so
they are the instructor's code; every other code cell is the learner's. The grader
splits the notebook into

* ``parameters``: the values of the parameters cells (``grader.parameters``: literal
  assignments of the instructor's names, read and never run; a refused cell counts as
  the instructor's values and gets the refusal as its error, ``parameter_errors``);
* ``lab``: the lab's locked cells that are not tests (imports, setup tools), run by the
  grader in its own process;
* ``tests``: the graded test cells, run by the grader only;
* ``learner``: the code the sandbox runs: the parameters as assignments of their values,
  the lab's setup cells but those its grading.toml keeps in the grader (``grader_only``:
  the tests' references) and without their imports of what the lab refuses (absent from
  the sandbox), the solution cells in full, and from any other learner cell only what it
  defines (``def``, ``class``, ``import``, and assignments of literals, names, lambdas and
  ``functools.partial``), so a demonstration cell never runs during grading; ``%%sbatch``
  cells (cluster jobs) are not graded and are left out;
* ``programs``: the ``%%program name`` cells, each an importable module in the sandbox;
* ``learner_names``: every name the learner's cells bind (``a, b = f, g``, imports, ``for``
  targets...), but builtins, special names and what the lab's cells or parameters bind:
  the tests see each as a reference to the learner's object in the sandbox.
"""

from __future__ import annotations

import ast
import builtins
import symtable
from dataclasses import dataclass, field

from helpers.course.grading.grader import parameters as params
from helpers.course.grading.grader.lab import Lab
from helpers.course.grading.grader.magics import python_of
from helpers.course.grading.lab_policy import DEMO_TAG, is_lab_cell, nbgrader_meta

__all__ = ["Cell", "Parts", "is_parameters_cell", "python_of", "split"]

_NOT_LEARNER = set(dir(builtins)) | {"__builtins__", "__name__", "__doc__", "__file__"}


@dataclass
class Cell:
    index: int
    name: str  # how messages name it: "cell 'test_zero3'" or "cell 7"
    source: str  # plain Python (magics removed)


@dataclass
class Parts:
    parameters: dict = field(default_factory=dict)  # name -> value, for the grader's namespace
    parameter_errors: dict[int, str] = field(default_factory=dict)  # cell index -> why refused
    lab: list[Cell] = field(default_factory=list)
    tests: list[Cell] = field(default_factory=list)
    learner: list[Cell] = field(default_factory=list)
    programs: dict[str, str] = field(default_factory=dict)
    learner_names: set[str] = field(default_factory=set)  # defined by the learner only


def is_parameters_cell(cell) -> bool:
    """A parameters cell (papermill's tags) that is neither the lab's nor a solution cell."""
    tags = cell.get("metadata", {}).get("tags", [])
    return (
        cell.cell_type == "code"
        and any(t in tags for t in params.PARAMETER_TAGS)
        and not is_lab_cell(cell)
        and not nbgrader_meta(cell).get("solution")
    )


def _definition_value(node: ast.AST) -> bool:
    """A value that defines rather than computes: literals, names, lambdas, arithmetic of
    those, partial(...)."""
    if isinstance(node, ast.Constant | ast.Name | ast.Lambda):
        return True
    if isinstance(node, ast.Attribute):
        return _definition_value(node.value)
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return all(_definition_value(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(_definition_value(e) for e in [*node.keys, *node.values] if e is not None)
    if isinstance(node, ast.UnaryOp):
        return _definition_value(node.operand)
    if isinstance(node, ast.BinOp):  # N = 2 ** 10, HIDDEN = 4 * DIM
        return _definition_value(node.left) and _definition_value(node.right)
    if isinstance(node, ast.Call):
        func = ast.unparse(node.func)
        args = [*node.args, *(k.value for k in node.keywords)]
        return func in ("partial", "functools.partial") and all(map(_definition_value, args))
    return False


def _definitions(code: str) -> str:
    """Only what a cell defines: functions, classes, imports, assignments of definitions."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code  # the sandbox reports the syntax error on the cell
    keep = []
    for node in tree.body:
        if isinstance(
            node,
            ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Import | ast.ImportFrom,
        ):
            keep.append(node)
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            if _definition_value(node.value):
                keep.append(node)
    return ast.unparse(ast.Module(body=keep, type_ignores=[])) if keep else ""


def _defined_names(code: str) -> set[str]:
    """Every name ``code`` binds in the notebook's namespace (any statement, ``global`` too)."""
    try:
        table = symtable.symtable(code, "<cell>", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    names = {
        s.get_name()
        for s in table.get_symbols()
        if s.is_assigned() or s.is_imported() or s.is_namespace()
    }
    stack = list(table.get_children())
    while stack:  # `global x` then `x = ...` inside a function binds a notebook name
        child = stack.pop()
        names |= {
            s.get_name() for s in child.get_symbols() if s.is_declared_global() and s.is_assigned()
        }
        stack += child.get_children()
    return names


def _refused_module(module: str, refused: dict) -> bool:
    return any(module == m or module.startswith(m + ".") for m in refused)


def _without_refused_imports(code: str, refused: dict) -> str:
    """A lab cell for the sandbox: its imports of what the lab refuses (absent there) left out."""
    if not refused:
        return code
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    body, dropped = [], False
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and _refused_module(node.module or "", refused):
            dropped = True
            continue
        if isinstance(node, ast.Import):
            kept = [a for a in node.names if not _refused_module(a.name, refused)]
            dropped |= len(kept) < len(node.names)
            node.names = kept
            if not kept:
                continue
        body.append(node)
    return ast.unparse(ast.Module(body=body, type_ignores=[])) if dropped else code


def _name(cell, index: int) -> str:
    grade_id = nbgrader_meta(cell).get("grade_id")
    return f"cell {grade_id!r}" if grade_id else f"cell {index + 1}"


def _parameters_cell(parts: Parts, lab: Lab, index: int, source: str, name: str) -> None:
    """Read one parameters cell as data; the sandbox gets assignments of its values."""
    got = params.read(source, lab.parameters)
    values = got.values
    if got.problems:
        values = dict(lab.parameters)
        parts.parameter_errors[index] = "\n".join(
            [f"{name} was not used:", *got.problems, params.what_it_may_hold(lab.parameters)]
        )
    parts.parameters.update(values)
    if values:
        parts.learner.append(Cell(index, name, params.as_source(values)))


def split(nb, lab: Lab | None = None, skip: set[int] = frozenset()) -> Parts:
    """The parts of ``nb``; cells in ``skip`` (refused by the guard) run nowhere."""
    lab = lab or Lab()
    parts, lab_names = Parts(parameters=dict(lab.parameters)), set()
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or i in skip:
            continue
        if DEMO_TAG in cell.get("metadata", {}).get("tags", []) and not is_lab_cell(cell):
            continue
        if is_parameters_cell(cell):
            _parameters_cell(parts, lab, i, cell.source, _name(cell, i))
            continue
        magic, arg, code = python_of(cell.source)
        meta = nbgrader_meta(cell)
        entry = Cell(i, _name(cell, i), code)
        if magic not in (None, "program"):
            continue  # %%sbatch and other cell magics: not graded, not run
        sandboxed = not is_lab_cell(cell) or meta.get("grade_id") not in lab.grader_only
        if magic == "program" and arg and sandboxed:
            parts.programs[arg] = code
        if is_lab_cell(cell):
            lab_names |= _defined_names(code)
            if meta.get("grade") and not meta.get("solution"):
                parts.tests.append(entry)
                continue
            parts.lab.append(entry)
            if sandboxed:
                code = _without_refused_imports(code, lab.refused)
                parts.learner.append(Cell(i, entry.name, code))
        elif meta.get("solution"):
            parts.learner.append(entry)
            parts.learner_names |= _defined_names(code)
        else:
            definitions = _definitions(code)
            if definitions:
                parts.learner.append(Cell(i, entry.name, definitions))
                parts.learner_names |= _defined_names(definitions)
    parts.learner_names -= lab_names | set(parts.parameters) | _NOT_LEARNER
    parts.learner_names = {n for n in parts.learner_names if not n.startswith("__")}
    return parts


def learner_program(parts: Parts) -> str:
    """The learner's cells as one program: each cell runs even if an earlier one failed, and
    ``__workbook_cell_errors__()`` returns [[cell index, message], ...] of the ones that did."""
    lines = ["import contextlib as __c__, io as __io__", "__workbook_errors__ = []", ""]
    for cell in parts.learner:  # what the cells print while the namespace is built is dropped
        lines += [
            "try:",
            "    with __c__.redirect_stdout(__io__.StringIO()):",
            f"        exec(compile({cell.source!r}, {f'<{cell.name}>'!r}, 'exec'), globals())",
            "except BaseException as __e__:  # noqa: BLE001 - reported on its cell",
            f"    __workbook_errors__.append([{cell.index}, f'{{type(__e__).__name__}}: {{__e__}}'])",
            "",
        ]
    lines += ["def __workbook_cell_errors__():", "    return list(__workbook_errors__)", ""]
    return "\n".join(lines)
