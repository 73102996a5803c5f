"""Grading round trips: fake students, plausible wrong answers, nbgrader's autograde.

The grading tests submit fake students per lab: the untouched release (must
score 0), the solution (full marks) and every plausible wrong answer (each
strictly in between, except those that reach into the grader: named ``tamper_*``
or ``rewrites_recorder_*``, they must score 0). Wrong answers live next to the solution in
``solutions/<lab>/wrong_answers.py`` (never released: nbgrader_config.py ignores
it). It is plain Python split into answers and cells by header lines::

    # comments for the reader
    # === wrong: forgets_to_divide
    # %% cell: average_gradients
    def average_gradients(d, model):
        ...                       # the whole replacement source of that cell
    # === wrong: calls_the_library
    # %% cell: ring_all_reduce
    ...

Each ``# === wrong: NAME`` starts one fake student, ``wrong-NAME``; each
``# %% cell: GRADE_ID`` names a solution cell whose source the text up to the
next header replaces. Solution cells not named keep the solution. A file with
no ``# === wrong:`` line is one wrong answer called ``wrong``.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat

from helpers.course.grading.course_dir import (
    generate,
    generate_all,
    make_course,
    nbgrader,
    notebooks,
    venv_on_path,
)
from helpers.runs import workbook_root

WRONG_ANSWERS = "wrong_answers.py"
FIXED_STUDENTS = ("release", "solution")
# Wrong answers are named by the shortcut they try (labs/README.md lists the classes). Those
# that reach into the grader or rewrite the recorder must score zero; the guard refuses
# them, and imports of what the lab refuses, before they run.
ZERO_PREFIXES = ("tamper_", "rewrites_recorder_")
REFUSED_PREFIXES = (*ZERO_PREFIXES, "imports_")
_ANSWER_HEADER = re.compile(r"^# === wrong: *([A-Za-z0-9_]+) *$", re.MULTILINE)
_CELL_HEADER = re.compile(r"^# %% cell: *(\S+) *$", re.MULTILINE)
_SOLUTION_MARKER = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n?", re.MULTILINE)


def wrong_answers(lab_dir: Path) -> dict[str, dict[str, str]]:
    """Every wrong answer of ``<lab_dir>/wrong_answers.py``: {name: {grade_id: source}}."""
    path = Path(lab_dir) / WRONG_ANSWERS
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: add plausible wrong answers for this lab "
            "(format: see the docstring of helpers/course/grading/roundtrip.py)"
        )
    text = path.read_text()
    answers = _ANSWER_HEADER.split(text)
    blocks = (
        dict(zip(answers[1::2], answers[2::2], strict=True)) if len(answers) > 1 else {"": text}
    )
    out = {}
    for name, block in blocks.items():
        parts = _CELL_HEADER.split(block)
        if len(parts) < 3:
            raise ValueError(f"{path}: wrong answer {name!r} has no '# %% cell: <grade_id>' line")
        # parts = [preamble, id1, body1, id2, body2, ...]
        cells = zip(parts[1::2], parts[2::2], strict=True)
        out[f"wrong-{name}" if name else "wrong"] = {cid: body.strip("\n") for cid, body in cells}
    return out


def students(lab_dir: Path) -> list[str]:
    """The fake students of a lab's round trip: release, solution and each wrong answer."""
    return [*FIXED_STUDENTS, *wrong_answers(lab_dir)]


def solution_source(source: str) -> str:
    """A solution cell as a learner who found the answer would type it (markers removed)."""
    return _SOLUTION_MARKER.sub("", source).rstrip("\n")


def fill_in(
    released: nbformat.NotebookNode, solution: nbformat.NotebookNode, replacements: dict[str, str]
) -> nbformat.NotebookNode:
    """The released notebook with every solution cell answered: from ``replacements``
    when it names the cell's grade_id, otherwise with the solution."""
    answers = {
        c.metadata["nbgrader"]["grade_id"]: solution_source(c.source)
        for c in solution.cells
        if c.metadata.get("nbgrader", {}).get("solution")
    }
    out = nbformat.from_dict(released)
    for cell in out.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            cell.source = replacements.get(meta["grade_id"], answers[meta["grade_id"]])
    return out


def submit_fake_students(course: Path, lab: str) -> None:
    """Write submitted/<student>/<lab>/ for every fake student into a course with a release."""
    course = Path(course)
    wrong = wrong_answers(course / "solutions" / lab)
    used: set[str] = set()
    for src in notebooks(course / "solutions" / lab):
        released = nbformat.read(course / "labs" / lab / src.name, as_version=4)
        solution = nbformat.read(src, as_version=4)
        meta = [c.metadata.get("nbgrader", {}) for c in released.cells]
        ids = {m["grade_id"] for m in meta if m.get("solution")}
        versions = {"release": released, "solution": fill_in(released, solution, {})}
        for student, cells in wrong.items():
            used |= ids & set(cells)
            versions[student] = fill_in(released, solution, cells)
        for student, nb in versions.items():
            path = course / "submitted" / student / lab / src.name
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, path)
    named = {cid for cells in wrong.values() for cid in cells}
    if unknown := named - used:
        raise ValueError(
            f"solutions/{lab}/{WRONG_ANSWERS} names cells {sorted(unknown)} that are not "
            f"solution cells of {lab}: use the grade_id of a cell with '### BEGIN SOLUTION'"
        )


def scores_of(course: Path, lab: str) -> dict[str, tuple[float, float]]:
    """(score, max) per student of ``lab``, from the course's gradebook."""
    from nbgrader.api import Gradebook

    db = f"sqlite:///{Path(course).resolve() / 'gradebook.db'}"
    with venv_on_path(), Gradebook(db) as gb:
        return {s.student.id: (s.score, s.max_score) for s in gb.assignment_submissions(lab)}


def autograde(course: Path, lab: str, check: bool = True) -> dict[str, tuple[float, float]]:
    """Autograde every submission of ``lab`` in one nbgrader call; (score, max) per student.

    ``check=False``: a submission nbgrader cannot grade (not a notebook) is not an
    error here; it has no score, and every other submission is graded.
    """
    nbgrader(["autograde", lab, "--force"], cwd=course, check=check)
    return scores_of(course, lab)


def roundtrip(lab: str, workdir: Path, root: Path | None = None) -> dict[str, tuple[float, float]]:
    """Release, submit every fake student and autograde them all, in ``workdir``."""
    course = make_course(Path(workdir), root)
    generate(course, lab)
    submit_fake_students(course, lab)
    return autograde(course, lab)


def roundtrip_labs(
    lab_list: list[str], workdir: Path, root: Path | None = None
) -> dict[str, dict[str, tuple[float, float]]]:
    """``roundtrip`` for several labs in one course, with one nbgrader call per step.

    Each nbgrader command costs ~3 s of start-up before it does anything; here the
    release, the grading (every student of every lab) are one call each, whatever the
    number of labs (nbgrader reads ``"*"`` as every assignment). {lab: scores}.
    """
    course = make_course(Path(workdir), root)
    for folder in (course / "solutions").iterdir():
        if folder.is_dir() and folder.name not in lab_list:
            shutil.rmtree(folder)
    generate_all(course)
    for lab in lab_list:
        submit_fake_students(course, lab)
    # every lab's release, solution and wrong answers in one call: 30 min and more on a busy 2-core machine
    nbgrader(["autograde", "*", "--force"], cwd=course, timeout=3600)
    return {lab: scores_of(course, lab) for lab in lab_list}


def validate(notebook: Path, invert: bool = False) -> tuple[bool, str]:
    """``nbgrader validate [--invert]``: (passed, output). nbgrader exits 0 either way."""
    nb = Path(notebook).resolve()
    args = ["validate", *(["--invert"] if invert else []), str(nb)]
    # Run from the checkout so its nbgrader_config.py (cell timeout) applies.
    out = nbgrader(args, cwd=workbook_root(nb.parent) or nb.parent)
    ok = "Success!" in out and "FAILED" not in out and "NOTEBOOK PASSED" not in out
    return ok, out
