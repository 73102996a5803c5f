"""What the guard needs to know about one lab notebook: its own cells, names and refused imports.

The lab's own cells are the locked and graded ones (nbgrader restores them before
grading); every other code cell is learner code. ``policy_for`` builds the
``Policy`` the scanner applies to learner code: the imports the lab refuses (its
``grading.toml``), the names its cells define that its tests rely on (functions,
classes, CONSTANTS, and the globals those functions read), the imports those cells
make (the same import may be made again), the learner's own ``%%program`` modules, and
module files next to the notebook that would shadow an installed module.
"""

from __future__ import annotations

import ast
import symtable
import tomllib
from pathlib import Path

from helpers.course.grading.refusals import Policy
from helpers.course.grading.scanner import split_magic

__all__ = [
    "DEMO_TAG",
    "GRADING_FILE",
    "is_lab_cell",
    "lab_imports",
    "learner_cells",
    "nbgrader_meta",
    "policy_for",
]

GRADING_FILE = "grading.toml"
# Cells tagged so are demonstrations: nbgrader (autograde and Validate) skips them. They are
# not graded, and they repeat what the tests do; papermill and JupyterLab still run them.
DEMO_TAG = "demo"


def lab_imports(directory: Path) -> dict[str, str]:
    """{module: why} from the lab's grading.toml (``[refuse.imports]``); {} without one."""
    path = Path(directory) / GRADING_FILE
    if not path.is_file():
        return {}
    with path.open("rb") as f:
        data = tomllib.load(f)
    table = data.get("refuse", {}).get("imports", {})
    bad = [k for k, v in table.items() if not isinstance(v, str) or not v.strip()]
    if bad:
        raise ValueError(f"{path}: [refuse.imports] {bad[0]!r} needs a reason (a string)")
    return dict(table)


def nbgrader_meta(cell) -> dict:
    """A cell's nbgrader metadata ({} for a plain cell)."""
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def is_lab_cell(cell) -> bool:
    """One of the lab's own locked or graded cells (nbgrader restores it before grading)."""
    m = nbgrader_meta(cell)
    return (
        bool(m.get("grade_id"))
        and not m.get("solution")
        and bool(m.get("locked") or m.get("grade"))
    )


def learner_cells(nb) -> list[int]:
    """Indices of the code cells a learner wrote or may have changed, that grading runs
    (a cell tagged DEMO_TAG is skipped, so what it holds never runs)."""
    return [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
        and not is_lab_cell(c)
        and DEMO_TAG not in c.get("metadata", {}).get("tags", [])
    ]


def _parse(source: str) -> ast.Module | None:
    from IPython.core.inputtransformer2 import TransformerManager

    _, body = split_magic(source)
    try:
        return ast.parse(TransformerManager().transform_cell(body))
    except SyntaxError:
        return None


def _lab_names(nb) -> tuple[set[str], dict[str, str]]:
    """(names the lab's cells define that its tests rely on, {name: import} of its imports)."""
    defined, bindings, used_inside, assigned = set(), {}, set(), set()
    for cell in nb.cells:
        if cell.cell_type != "code" or not is_lab_cell(cell):
            continue
        tree = _parse(cell.source)
        if tree is None:
            continue
        used_inside |= _globals_of_functions(ast.unparse(tree))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defined.add(node.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    name = a.asname or a.name.split(".")[0]
                    bindings[name] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    bindings[a.asname or a.name] = f"{node.module}.{a.name}"
            else:
                assigned |= {
                    n.id
                    for n in ast.walk(node)
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                }
    constants = {n for n in assigned if n.isupper()}  # WORLD_SIZE, WIDTHS, ALLOWED, ...
    protected = defined | constants | (assigned & used_inside)
    return protected - set(bindings), bindings


_INLINE_SCOPES = {"lambda", "listcomp", "setcomp", "dictcomp", "genexpr"}


def _globals_of_functions(source: str) -> set[str]:
    """Names the functions and classes of ``source`` read from the notebook's namespace."""
    found: set[str] = set()

    def walk(table: symtable.SymbolTable) -> None:
        for child in table.get_children():
            # def and class bodies run later, from other cells; lambdas and comprehensions
            # run in the cell that made them
            if child.get_name() not in _INLINE_SCOPES:
                found.update(
                    s.get_name() for s in child.get_symbols() if s.is_global() and s.is_referenced()
                )
            walk(child)

    walk(symtable.symtable(source, "<cell>", "exec"))
    return found


def _programs(nb) -> set[str]:
    names = set()
    for cell in nb.cells:
        magic, _ = split_magic(cell.source) if cell.cell_type == "code" else (None, "")
        if magic in ("program", "sbatch"):
            words = cell.source.split("\n", 1)[0].split()
            if len(words) > 1:
                names.add(words[1])
    return names


def _shadowing(directory: Path | None) -> set[str]:
    """Module names that files next to the notebook would shadow in the kernel."""
    if directory is None or not Path(directory).is_dir():
        return set()
    found = {p.stem for p in Path(directory).glob("*.py")}
    found |= {p.parent.name for p in Path(directory).glob("*/__init__.py")}
    return found


def policy_for(nb, directory: Path | None) -> Policy:
    """The policy for this notebook: its lab's refused imports and its own cells' names."""
    protected, bindings = _lab_names(nb)
    return Policy(
        lab_imports=lab_imports(directory) if directory is not None else {},
        protected=protected,
        lab_bindings=bindings,
        programs=_programs(nb),
        shadowing=_shadowing(directory),
    )
