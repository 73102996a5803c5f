"""Every notebook and every lab solution runs top to bottom with SMOKE=True, and every
job it writes passes the dry run (its program at full size on fake tensors, and device-strict
on 2 CPU ranks: helpers.course.dryrun).

The same papermill call as `python -m helpers.course.book run --smoke --solutions`,
one test per notebook so a failure names the notebook and shows the cell.

A lab solution with a ``%%sbatch`` cell is run top to bottom, SMOKE and all, by
tests/slurm/test_lab_jobs.py, which also checks the job it submits; running it a
second time here would only repeat that (about 15 s per lab). The last test makes
sure that every notebook is run by one of the two.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.course.book import runner as book
from helpers.course import dryrun
from helpers.course.grading.labs import labs_with_jobs

ROOT = Path(__file__).resolve().parents[2]
WITH_JOBS = [p.relative_to(ROOT) for p in labs_with_jobs(ROOT)]
NOTEBOOKS = [nb for nb in book.discover(ROOT, solutions=True) if nb not in WITH_JOBS]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=str)
def test_notebook_runs_in_smoke_mode(notebook, tmp_path, monkeypatch):
    committed = (ROOT / notebook).read_bytes()
    monkeypatch.setenv("WORKBOOK_RUNS", str(tmp_path / "runs"))  # this notebook's jobs only
    result = book.execute(notebook, tmp_path / notebook.name, smoke=True, root=ROOT)
    assert result.ok, f"{notebook} failed after {result.seconds:.0f} s:\n{result.error}"
    assert result.output.is_file()
    assert (ROOT / notebook).read_bytes() == committed, "executing must not touch the notebook"
    # Every job it wrote, as a GPU cluster would run it (helpers.course.dryrun, `make dryrun`)
    rows = dryrun.check_written(tmp_path / "runs", str(notebook))
    assert all(r.ok for r in rows), f"{notebook} writes jobs a GPU cluster would reject:\n" + (
        dryrun.table([r for r in rows if not r.ok])
    )


def test_every_notebook_and_lab_solution_is_run_by_one_test():
    every = set(book.discover(ROOT, solutions=True))
    assert any(str(p).startswith("solutions/") for p in every), "no lab solutions found"
    assert set(NOTEBOOKS) | set(WITH_JOBS) == every
    assert not set(NOTEBOOKS) & set(WITH_JOBS)
