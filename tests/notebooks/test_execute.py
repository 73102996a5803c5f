"""Every notebook and every lab solution runs top to bottom with SMOKE=True.

The same papermill call as `python -m helpers.course.book run --smoke --solutions`,
one test per notebook so a failure names the notebook and shows the cell.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.course import book

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = book.discover(ROOT, solutions=True)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=str)
def test_notebook_runs_in_smoke_mode(notebook, tmp_path):
    committed = (ROOT / notebook).read_bytes()
    result = book.execute(notebook, tmp_path / notebook.name, smoke=True, root=ROOT)
    assert result.ok, f"{notebook} failed after {result.seconds:.0f} s:\n{result.error}"
    assert result.output.is_file()
    assert (ROOT / notebook).read_bytes() == committed, "executing must not touch the notebook"
