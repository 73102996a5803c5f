"""The instructor's solution against many draws of every hidden test, outside nbgrader.

Hidden tests draw their random cases ``HIDDEN_DRAWS`` times (the labs' first cell sets
it to 1 for grading) and run all of them in one spawn per world size. Running a lab's
own cells with ``HIDDEN_DRAWS = 1000`` therefore checks 1,000 draws of every randomised
hidden test at about the cost of one pass, in a real kernel with real ranks::

    python -m helpers.course.grading.draws lab2 --draws 1000    # prints seconds per test cell

Only the cells grading needs are run: the lab's own cells (imports, tools, tests, with
their hidden parts) and the solution cells; the demonstrations and the cluster cells
are left out. A test that draws from a small fixed set of cases (lab 5's training
runs) takes all of them once the draws outnumber them.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell

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
        keep.append(cell)
        if meta.get("grade_id") == "imports":
            keep.append(
                new_code_cell(f"HIDDEN_DRAWS = {int(draws)}  # set by helpers.course.grading.draws")
            )
    if not any(c.source.startswith("HIDDEN_DRAWS") for c in keep):
        raise ValueError(f"{path}: no locked 'imports' cell to set HIDDEN_DRAWS after")
    nb.cells = keep
    return nb


def _seconds(cell) -> float:
    times = cell.metadata.get("execution", {})
    start, end = times.get("iopub.execute_input"), times.get("shell.execute_reply")
    if not start or not end:
        return 0.0
    parse = datetime.datetime.fromisoformat
    return (parse(end.replace("Z", "+00:00")) - parse(start.replace("Z", "+00:00"))).total_seconds()


def run_draws(lab: str, draws: int = 1000, root: Path | None = None, timeout: float = 900):
    """[(cell grade_id, seconds, error or None)] of the lab's cells run with ``draws`` draws."""
    from nbclient import NotebookClient

    out = []
    for path in notebooks(_root(root) / "solutions" / lab):
        nb = draw_notebook(path, draws)
        with tempfile.TemporaryDirectory(prefix=f"draws-{lab}-") as tmp:
            client = NotebookClient(
                nb, timeout=timeout, kernel_name="python3", allow_errors=True, record_timing=True,
                resources={"metadata": {"path": tmp}},
            )  # fmt: skip
            client.execute()
        for cell in nb.cells:
            errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            error = f"{errors[0]['ename']}: {errors[0]['evalue']}" if errors else None
            name = cell.metadata.get("nbgrader", {}).get("grade_id") or cell.source.split("\n")[0]
            out.append((name, _seconds(cell), error))
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
        print(f"{lab:6s} {'(all, with the kernel)':28s} {time.perf_counter() - start:7.2f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
