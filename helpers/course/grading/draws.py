"""The instructor's solution against many draws of every hidden test, outside nbgrader.

Hidden tests draw their random cases ``HIDDEN_DRAWS`` times (the labs' first cell sets
it to 1 for grading) and run all of them in one spawn per world size. Running a lab's
own cells with ``HIDDEN_DRAWS = 1000`` therefore checks 1,000 draws of every randomised
hidden test at about the cost of one pass, graded as autograde grades (the tests in this
process, the solution in the sandbox, the ranks through the relay)::

    python -m helpers.course.grading.draws lab2 --draws 1000    # prints seconds per test cell

Only the cells grading needs are run: the lab's own cells (imports, tools, tests, with
their hidden parts) and the solution cells; the demonstrations and the cluster cells
are left out. A test that draws from a small fixed set of cases (lab 5's training
runs) takes all of them once the draws outnumber them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat

from helpers.course.grading.course_dir import _root, lab_names, notebooks
from helpers.course.grading.lab_policy import is_lab_cell
from helpers.course.grading.roundtrip import solution_source

__all__ = ["draw_notebook", "run_draws"]


def draw_notebook(path: Path, draws: int):
    """The solution notebook's grading cells, with HIDDEN_DRAWS = ``draws`` after its imports."""
    nb = nbformat.read(path, as_version=4)
    keep = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        tagged = "parameters" in cell.metadata.get("tags", [])
        if cell.cell_type != "code" or not (tagged or meta.get("solution") or is_lab_cell(cell)):
            continue
        cell.source = solution_source(cell.source)
        cell.outputs, cell.execution_count = [], None
        if meta.get("grade_id") == "imports":
            cell.source += f"\nHIDDEN_DRAWS = {int(draws)}  # set by helpers.course.grading.draws\n"
        keep.append(cell)
    if not any("# set by helpers.course.grading.draws" in c.source for c in keep):
        raise ValueError(f"{path}: no locked 'imports' cell to set HIDDEN_DRAWS in")
    nb.cells = keep
    return nb


def run_draws(lab: str, draws: int = 1000, root: Path | None = None):
    """[(cell grade_id, seconds, error or None)] of the lab's test cells with ``draws`` draws."""
    from helpers.course.grading.grader.preprocessor import shared_pool
    from helpers.course.grading.grader.run import grade

    out = []
    for path in notebooks(_root(root) / "solutions" / lab):
        nb, seconds = draw_notebook(path, draws), {}
        outputs = grade(nb, path.parent, shared_pool(), seconds=seconds)
        for index, took in sorted(seconds.items()):
            errors = [o for o in outputs.get(index, []) if o.get("output_type") == "error"]
            error = f"{errors[0]['ename']}: {errors[0]['evalue']}" if errors else None
            out.append((nb.cells[index].metadata["nbgrader"]["grade_id"], took, error))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m helpers.course.grading.draws", description=__doc__.split("\n")[0]
    )
    ap.add_argument("labs", nargs="*", help="default: every lab")
    ap.add_argument("--draws", type=int, default=1000)
    args = ap.parse_args(argv)
    failed = False
    for lab in args.labs or lab_names():
        start = time.perf_counter()
        for name, seconds, error in run_draws(lab, args.draws):
            failed |= error is not None
            print(f"{lab:6s} {name:28s} {seconds:7.2f} s  {error or ''}")
        print(f"{lab:6s} {'(all, graded)':28s} {time.perf_counter() - start:7.2f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
