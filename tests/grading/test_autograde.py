"""The autograder round trip: nbgrader scores the solution, the release and every wrong answer.

For every lab: a scratch course gets the checkout's nbgrader_config.py and
solutions/, `nbgrader generate_assignment` releases it, the fake students submit
(the untouched release, the solution, and each wrong answer of the lab's
wrong_answers.py), one `nbgrader autograde` call grades them all, and the scores
are read from the gradebook. Wrong answers that reach into the grader or rewrite the
traffic recorder (names starting tamper_ or rewrites_recorder_) must score zero; every
other one something between zero and full marks. Then `nbgrader export` writes the
grades CSV an instructor reads: its `refused` column names, for each refused
submission, the construct and its line; and the feedback of a tampering submission
tells the learner the same.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import nbformat
import pytest

from helpers.course import grading, labs
from helpers.course.course_dir import nbgrader

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("lab", labs.lab_names(ROOT))
def test_autograde_scores(lab, tmp_path):
    scores = grading.roundtrip(lab, tmp_path, ROOT)
    print(f"{lab}: " + ", ".join(f"{s} {a:g}/{b:g}" for s, (a, b) in sorted(scores.items())))
    assert set(scores) == set(grading.students(ROOT / "solutions" / lab)), scores
    score, max_score = scores["solution"]
    assert max_score > 0, f"{lab} has no points to give"
    assert score == max_score, f"the solution of {lab} scored {score}/{max_score}"
    assert scores["release"][0] == 0, (
        f"the untouched release of {lab} scored {scores['release'][0]}: some test does not "
        "depend on the learner's answer"
    )
    for student, (wrong, _) in scores.items():
        if student.startswith("wrong-") and student[6:].startswith(grading.ZERO_PREFIXES):
            assert wrong == 0, f"{student} of {lab} reaches into the grader but scored {wrong}"
        elif student.startswith("wrong"):
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

    # What the instructor sees: the grades CSV says why a refused submission scored zero.
    nbgrader(["export", "--to", "grades.csv"], cwd=tmp_path)
    rows = {r["student_id"]: r for r in csv.DictReader((tmp_path / "grades.csv").open())}
    assert rows["solution"]["refused"] == "" and rows["release"]["refused"] == ""
    for student in scores:
        if student.startswith("wrong-") and student[6:].startswith(grading.REFUSED_PREFIXES):
            refused = rows[student]["refused"]
            assert "Refused" in refused and re.search(r"line \d+: ", refused), (student, refused)
            assert float(rows[student]["score"]) == scores[student][0]

    # What the learner sees: the feedback of a refused submission says what was refused.
    tampered = sorted(s for s in scores if s.startswith("wrong-tamper_"))[0]
    nbgrader(["generate_feedback", lab, "--student", tampered, "--force"], cwd=tmp_path)
    (page,) = (tmp_path / "feedback" / tampered / lab).glob("*.html")
    html = page.read_text()
    assert "SubmissionRefused" in html and "no test was run" in html, f"{tampered}'s feedback"
    assert re.search(r"line \d+: ", html), f"{tampered}'s feedback names no line"
