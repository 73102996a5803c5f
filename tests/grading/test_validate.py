"""`nbgrader validate` passes on every solution and fails on every released lab.

Real nbgrader, real kernels, real ranks: each notebook is executed once. Every
notebook of every folder in solutions/ (and its release in labs/) is included.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.course import grading, labs

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = [
    nb.relative_to(ROOT)
    for lab in labs.lab_names(ROOT)
    for nb in labs.notebooks(ROOT / "solutions" / lab)
]

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("notebook", SOLUTIONS, ids=str)
def test_solution_passes_validate(notebook):
    ok, out = grading.validate(ROOT / notebook)
    assert ok, f"`nbgrader validate {notebook}` did not pass:\n{out}"


@pytest.mark.parametrize("notebook", SOLUTIONS, ids=str)
def test_release_fails_validate_inverted(notebook):
    released = ROOT / "labs" / notebook.relative_to("solutions")
    assert released.is_file(), f"{released} is missing: run `python -m helpers.course.labs release`"
    # --invert: every autograded test must fail on the untouched student version,
    # otherwise a learner gets points for nothing.
    ok, out = grading.validate(released, invert=True)
    assert ok, f"`nbgrader validate --invert {released}`: some tests pass without an answer:\n{out}"
