"""The autograder round trip: nbgrader scores the solution, the release and every wrong answer.

One scratch course gets the checkout's nbgrader_config.py and the solutions/ of
every lab this run selects (``-k lab3`` grades lab 3 only); one `nbgrader
generate_assignment "*"` releases them, the fake students submit (the untouched
release, the solution, and each wrong answer of the lab's wrong_answers.py), one
`nbgrader autograde "*"` call grades them all, and the scores are read from the
gradebook. Each nbgrader command spends ~3 s starting up: one call per step for all
labs, instead of four per lab, saves about 80 s of CI on 8 labs. Wrong answers that reach into the grader or rewrite the
traffic recorder (names starting tamper_ or rewrites_recorder_) must score zero; every
other one something between zero and full marks. Then `nbgrader export` writes the
grades CSV an instructor reads (one call, every lab): its `refused` column names, for
each refused submission, the construct and its line; and the feedback of the tampering
submissions (one `nbgrader generate_feedback` call) tells the learner the same.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import nbformat
import pytest

from helpers.course.grading import labs
from helpers.course.grading import roundtrip as grading
from helpers.course.grading.course_dir import nbgrader

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


LABS = labs.lab_names(ROOT)


@pytest.fixture(scope="module")
def graded(request, tmp_path_factory):
    """The course after grading every selected lab, its grades CSV and the feedback of the
    tampering submissions: (course, {lab: scores}, {(lab, student): CSV row})."""
    mine = [i for i in request.session.items if i.module is request.module]
    selected = sorted({i.callspec.params["lab"] for i in mine if hasattr(i, "callspec")})
    course = tmp_path_factory.mktemp("autograde")
    scores = grading.roundtrip_labs(selected, course, ROOT)
    _keep(scores, ROOT / "build" / "grading" / "scores.md")
    nbgrader(["export", "--to", "grades.csv"], cwd=course)
    nbgrader(["generate_feedback", "*", "--student", "wrong-tamper_*", "--force"], cwd=course)
    rows = {(r["assignment"], r["student_id"]): r
            for r in csv.DictReader((course / "grades.csv").open())}  # fmt: skip
    return course, scores, rows


def _keep(scores: dict, out: Path) -> None:
    """Each lab's fake students and their scores, as this run graded them, for the instructor.
    `make test` grades some labs in each of its two sessions: a lab's line replaces its old one."""
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = (
        dict(line.split(":", 1) for line in out.read_text().splitlines()) if out.exists() else {}
    )
    for lab, by in scores.items():
        lines[f"- {lab}"] = " " + ", ".join(f"{s} {a:g}/{b:g}" for s, (a, b) in sorted(by.items()))
    out.write_text("".join(f"{lab}:{rest}\n" for lab, rest in sorted(lines.items())))


@pytest.mark.parametrize("lab", LABS)
def test_autograde_scores(lab, graded):
    course, all_scores, all_rows = graded
    scores = all_scores[lab]
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
        done = nbformat.read(course / "autograded" / "solution" / lab / src.name, as_version=4)
        graded_source = {
            c.metadata.get("nbgrader", {}).get("grade_id"): c.source for c in done.cells
        }
        for cell in nbformat.read(src, as_version=4).cells:
            if "### BEGIN HIDDEN TESTS" in cell.source:
                hidden = cell.source.split("### BEGIN HIDDEN TESTS")[1].split("### END")[0]
                grade_id = cell.metadata["nbgrader"]["grade_id"]
                assert hidden.strip() in graded_source[grade_id], f"{grade_id}: hidden tests lost"

    # What the instructor sees: the grades CSV says why a refused submission scored zero.
    rows = {student: row for (a, student), row in all_rows.items() if a == lab}
    assert rows["solution"]["refused"] == "" and rows["release"]["refused"] == ""
    for student in scores:
        if student.startswith("wrong-") and student[6:].startswith(grading.REFUSED_PREFIXES):
            refused = rows[student]["refused"]
            assert "Refused" in refused and re.search(r"line \d+: ", refused), (student, refused)
            assert float(rows[student]["score"]) == scores[student][0]

    # What the learner sees: the feedback of a refused submission says what was refused.
    tampered = sorted(s for s in scores if s.startswith("wrong-tamper_"))[0]
    (page,) = (course / "feedback" / tampered / lab).glob("*.html")
    html = page.read_text()
    assert "SubmissionRefused" in html and "no test was run" in html, f"{tampered}'s feedback"
    assert re.search(r"line \d+: ", html), f"{tampered}'s feedback names no line"
