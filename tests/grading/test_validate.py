"""`nbgrader validate`, the command behind the Validate button, both ways, on the first lab.

Real nbgrader, real kernels, real ranks. For EVERY lab, test_autograde.py already
makes the same two checks through autograde: the solution scores full marks (every
test cell passes, which is what validate reports) and the untouched release scores
zero (every test cell fails, which is what ``validate --invert`` reports). Running
validate on every lab as well repeated those executions (about 90 s of CI). Here the
command and ``grading.validate`` stay covered on lab 0, the lab whose Validate button
tests/browser/test_validate_button.py presses in JupyterLab.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.course.grading import labs
from helpers.course.grading import roundtrip as grading

ROOT = Path(__file__).resolve().parents[2]
FIRST = labs.lab_names(ROOT)[0]
SOLUTIONS = [nb.relative_to(ROOT) for nb in labs.notebooks(ROOT / "solutions" / FIRST)]

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("notebook", SOLUTIONS, ids=str)
def test_solution_passes_validate(notebook):
    ok, out = grading.validate(ROOT / notebook)
    assert ok, f"`nbgrader validate {notebook}` did not pass:\n{out}"


@pytest.mark.parametrize("notebook", SOLUTIONS, ids=str)
def test_release_fails_validate_inverted(notebook):
    released = ROOT / "labs" / notebook.relative_to("solutions")
    assert released.is_file(), (
        f"{released} is missing: run `python -m helpers.course.grading.labs release`"
    )
    # --invert: every autograded test must fail on the untouched student version,
    # otherwise a learner gets points for nothing.
    ok, out = grading.validate(released, invert=True)
    assert ok, f"`nbgrader validate --invert {released}`: some tests pass without an answer:\n{out}"


def test_validate_names_a_refused_construct_and_its_line(tmp_path):
    """What an honest learner sees before submitting: the construct the guard refuses, its
    line, and that no test ran. The notebook is lab 0's tampering wrong answer."""
    import shutil

    import nbformat

    lab = ROOT / "solutions" / FIRST
    released = nbformat.read(ROOT / "labs" / FIRST / f"{FIRST}.ipynb", as_version=4)
    solution = nbformat.read(lab / f"{FIRST}.ipynb", as_version=4)
    cells = grading.wrong_answers(lab)["wrong-tamper_ast_transformer"]
    nbformat.write(grading.fill_in(released, solution, cells), tmp_path / f"{FIRST}.ipynb")
    for name in ("grading.toml",):
        shutil.copy(ROOT / "labs" / FIRST / name, tmp_path / name)
    shutil.copy(ROOT / "nbgrader_config.py", tmp_path / "nbgrader_config.py")
    ok, out = grading.validate(tmp_path / f"{FIRST}.ipynb")
    assert not ok, out
    assert "SubmissionRefused" in out and "line 12: get_ipython" in out, out
    assert "Remove it and validate again" in out, out
