"""The autograder round trip: nbgrader scores the solution, the release and a wrong answer.

For every lab: a scratch course gets the checkout's nbgrader_config.py and
solutions/, `nbgrader generate_assignment` releases it, three fake students
submit (the untouched release, the solution, and the lab's wrong_answers.py),
one `nbgrader autograde` call grades them all, and the scores are read from
the gradebook.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from helpers.course import grading, labs

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("lab", labs.lab_names(ROOT))
def test_autograde_scores(lab, tmp_path):
    scores = grading.roundtrip(lab, tmp_path, ROOT)
    assert set(scores) == set(grading.students(ROOT / "solutions" / lab)), scores
    score, max_score = scores["solution"]
    assert max_score > 0, f"{lab} has no points to give"
    assert score == max_score, f"the solution of {lab} scored {score}/{max_score}"
    assert scores["release"][0] == 0, (
        f"the untouched release of {lab} scored {scores['release'][0]}: some test does not "
        "depend on the learner's answer"
    )
    for student, (wrong, _) in scores.items():
        if student.startswith("wrong"):
            assert 0 < wrong < max_score, (
                f"{student} of {lab} scored {wrong}/{max_score}; it should be partial "
                f"(edit solutions/{lab}/{grading.WRONG_ANSWERS} or the tests)"
            )

    # Hidden tests count: the graded copy holds them again (the release had them removed).
    for src in labs.notebooks(ROOT / "solutions" / lab):
        graded = nbformat.read(tmp_path / "autograded" / "solution" / lab / src.name, as_version=4)
        graded_source = {
            c.metadata.get("nbgrader", {}).get("grade_id"): c.source for c in graded.cells
        }
        for cell in nbformat.read(src, as_version=4).cells:
            if "### BEGIN HIDDEN TESTS" in cell.source:
                hidden = cell.source.split("### BEGIN HIDDEN TESTS")[1].split("### END")[0]
                grade_id = cell.metadata["nbgrader"]["grade_id"]
                assert hidden.strip() in graded_source[grade_id], f"{grade_id}: hidden tests lost"
