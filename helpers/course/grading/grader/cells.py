"""A lab notebook as data: what the grader runs itself, and what only the sandbox may run.

nbgrader has restored the lab's own cells (locked and graded ones) before grading, so
they are the instructor's code; every other code cell is the learner's. The grader
splits the notebook into

* ``parameters``: the literal assignments of the parameters cell (``SMOKE = False``);
* ``lab``: the lab's locked cells that are not tests (imports, setup tools), run by the
  grader in its own process;
* ``tests``: the graded test cells, run by the grader only;
* ``learner``: the code the sandbox runs: the imports cell, the lab's setup cells, the
  solution cells in full, and from any other learner cell only its definitions (``def``,
  ``class``, ``import`` and literal constants), so a demonstration cell never runs
  during grading; ``%%sbatch`` cells (cluster jobs) are not graded and are left out;
* ``programs``: the ``%%program name`` cells, each an importable module in the sandbox.

Magics: a ``%line`` or ``!shell`` line becomes ``pass``; ``%%program name`` keeps its
body (and registers the module); any other cell magic leaves the cell out.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from helpers.course.grading.lab_policy import DEMO_TAG, is_lab_cell, nbgrader_meta

__all__ = ["Cell", "Parts", "python_of", "split"]


@dataclass
class Cell:
    index: int
    name: str  # how messages name it: "cell 'test_zero3'" or "cell 7"
    source: str  # plain Python (magics removed)


@dataclass
class Parts:
    parameters: str = ""
    lab: list[Cell] = field(default_factory=list)
    tests: list[Cell] = field(default_factory=list)
    learner: list[Cell] = field(default_factory=list)
    programs: dict[str, str] = field(default_factory=dict)
    learner_names: set[str] = field(default_factory=set)  # defined by the learner only


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


def _definitions(code: str) -> str:
    """Only what a cell defines: functions, classes, imports, literal constants."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code  # the sandbox reports the syntax error on the cell
    keep = []
    for node in tree.body:
        if isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)
        ):
            keep.append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            try:
                ast.literal_eval(node.value)
            except ValueError:
                continue
            keep.append(node)
    return ast.unparse(ast.Module(body=keep, type_ignores=[])) if keep else ""


def _defined_names(code: str) -> set[str]:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _name(cell, index: int) -> str:
    grade_id = nbgrader_meta(cell).get("grade_id")
    return f"cell {grade_id!r}" if grade_id else f"cell {index + 1}"


def split(nb, skip: set[int] = frozenset()) -> Parts:
    """The parts of ``nb``; cells in ``skip`` (refused by the guard) run nowhere."""
    parts, lab_names = Parts(), set()
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or i in skip:
            continue
        if DEMO_TAG in cell.get("metadata", {}).get("tags", []) and not is_lab_cell(cell):
            continue
        magic, arg, code = python_of(cell.source)
        meta = nbgrader_meta(cell)
        entry = Cell(i, _name(cell, i), code)
        if magic not in (None, "program"):
            continue  # %%sbatch and other cell magics: not graded, not run
        if magic == "program" and arg:
            parts.programs[arg] = code
        if is_lab_cell(cell):
            if meta.get("grade") and not meta.get("solution"):
                parts.tests.append(entry)
                continue
            parts.lab.append(entry)
            parts.learner.append(entry)
            lab_names |= _defined_names(code)
        elif meta.get("solution"):
            parts.learner.append(entry)
            parts.learner_names |= _defined_names(code)
        else:
            definitions = _definitions(code)
            if not meta and "parameters" in cell.get("metadata", {}).get("tags", []):
                parts.parameters = definitions
            if definitions:
                parts.learner.append(Cell(i, entry.name, definitions))
                parts.learner_names |= _defined_names(definitions)
    parts.learner_names -= lab_names | _defined_names(parts.parameters)
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
