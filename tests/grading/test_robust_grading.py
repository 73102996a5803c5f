"""One bad submission never stops a class's grading.

Five learners submit lab 0 to one ``nbgrader autograde`` call: a correct answer,
an answer whose cell loops forever, a file that is not JSON, a notebook whose
first test cell was deleted, and one where a graded cell was copied in JupyterLab
(so two cells carry the same grade_id). The correct answer must get full marks
and the others must each be graded or reported, never stopping the batch.
"""

from __future__ import annotations

import copy

import nbformat
import pytest

from helpers.course.grading import roundtrip as grading
from helpers.course.grading.course_dir import generate, make_course, notebooks

pytestmark = pytest.mark.slow

LAB = "lab0"
CELL_TIMEOUT_S = 15  # the class setting is 120 s; the loop need not burn that here


def _cells(nb, kind: str) -> list[int]:
    return [i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get(kind)]


def _submissions(released, solution) -> dict[str, object]:
    good = grading.fill_in(released, solution, {})
    first_answer = released.cells[_cells(released, "solution")[0]]
    looping = grading.fill_in(
        released,
        solution,
        {
            first_answer.metadata.nbgrader.grade_id: "while True:  # a learner's endless loop\n    pass"
        },
    )
    deleted = copy.deepcopy(good)
    del deleted.cells[_cells(deleted, "grade")[0]]  # the first autograded test cell
    duplicated = copy.deepcopy(good)
    i = _cells(duplicated, "solution")[0]
    duplicated.cells.insert(i + 1, copy.deepcopy(duplicated.cells[i]))  # same metadata twice
    return {
        "good": good,
        "looping": looping,
        "not_json": '{"cells": [ this is not a notebook',
        "deleted_test": deleted,
        "duplicated_cell": duplicated,
    }


def test_a_bad_submission_never_stops_the_batch(tmp_path):
    course = make_course(tmp_path / "course")
    with (course / "nbgrader_config.py").open("a") as f:
        f.write(f"\nc.Execute.timeout = {CELL_TIMEOUT_S}\n")
    released_dir = generate(course, LAB)
    solution_path = notebooks(course / "solutions" / LAB)[0]
    released = nbformat.read(released_dir / solution_path.name, as_version=4)
    solution = nbformat.read(solution_path, as_version=4)
    for student, nb in _submissions(released, solution).items():
        path = course / "submitted" / student / LAB / solution_path.name
        path.parent.mkdir(parents=True)
        if isinstance(nb, str):
            path.write_text(nb)
        else:
            nbformat.write(nb, path)

    scores = grading.autograde(course, LAB, check=False)
    print("scores (score, max):", scores)

    full = scores["good"][1]
    assert full > 0 and scores["good"] == (full, full), scores
    # The endless loop was stopped by the cell timeout; its tests failed, the run went on.
    assert scores["looping"][0] < full, scores
    assert "duplicated_cell" in scores, "a copied cell aborted the batch"
    # A deleted test cell cannot be passed by deleting it.
    assert "deleted_test" not in scores or scores["deleted_test"][0] < full, scores
    # Not a notebook: nbgrader reports it and records no grade; it does not crash the batch.
    assert scores.get("not_json", (0.0, full))[0] == 0.0, scores
    assert (course / "autograded" / "good" / LAB / solution_path.name).is_file()
