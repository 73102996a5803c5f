"""labs/ is the nbgrader release of solutions/, and the lab files are well formed.

Fast checks (no notebook is executed). Every folder of solutions/ is a lab and
is picked up here without registration.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from helpers.course.grading import labs
from helpers.course.grading import roundtrip as grading

ROOT = Path(__file__).resolve().parents[2]
LABS = labs.lab_names(ROOT)


@pytest.fixture(scope="module")
def fresh_release(tmp_path_factory) -> Path:
    """labs/ regenerated from solutions/ into a scratch folder, once per test run."""
    dest = tmp_path_factory.mktemp("release") / "labs"
    labs.release(ROOT, dest)
    return dest


def test_there_is_at_least_one_lab():
    assert "lab0" in LABS, f"solutions/ should hold lab0; found {LABS}"


@pytest.mark.parametrize("lab", LABS)
def test_labs_in_sync_with_solutions(lab, fresh_release):
    problems = labs.compare(fresh_release, ROOT / "labs", lab)
    assert not problems, (
        "labs/ is out of date with solutions/:\n  "
        + "\n  ".join(problems)
        + "\nRun `python -m helpers.course.grading.labs release` and commit labs/."
    )


def test_no_stale_released_lab():
    assert not labs.stale_labs(ROOT), "labs/ holds labs that solutions/ no longer has"


@pytest.mark.parametrize("lab", LABS)
def test_release_hides_solutions_hidden_tests_and_wrong_answer(lab):
    released = ROOT / "labs" / lab
    assert not (released / grading.WRONG_ANSWERS).exists(), "wrong answers must not be released"
    for path in labs.notebooks(released):
        text = path.read_text()
        for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS"):
            assert marker not in text, f"{path.relative_to(ROOT)} still contains {marker!r}"


@pytest.mark.parametrize("lab", LABS)
def test_solution_has_graded_tests_and_a_hidden_one(lab):
    cells = [
        c
        for path in labs.notebooks(ROOT / "solutions" / lab)
        for c in nbformat.read(path, as_version=4).cells
    ]
    meta = [c.metadata.get("nbgrader", {}) for c in cells]
    graded = [m for m in meta if m.get("grade")]
    assert graded, f"{lab} has no autograded test cell"
    assert all(m.get("points", 0) > 0 for m in graded), f"{lab}: a graded cell has no points"
    assert any(m.get("solution") for m in meta), f"{lab} has no solution cell"
    assert any("### BEGIN HIDDEN TESTS" in c.source for c in cells), f"{lab} has no hidden test"
    ids = [m["grade_id"] for m in meta if "grade_id" in m]
    assert len(ids) == len(set(ids)), f"{lab}: duplicate grade_id in {ids}"


@pytest.mark.parametrize("lab", LABS)
def test_at_least_three_wrong_answers_naming_solution_cells(lab):
    wrong = grading.wrong_answers(ROOT / "solutions" / lab)
    solution_ids = {
        c.metadata["nbgrader"]["grade_id"]
        for path in labs.notebooks(ROOT / "solutions" / lab)
        for c in nbformat.read(path, as_version=4).cells
        if c.metadata.get("nbgrader", {}).get("solution")
    }
    assert len(wrong) >= 3, (
        f"solutions/{lab}/{grading.WRONG_ANSWERS} has {len(wrong)} wrong answers"
    )
    for name, cells in wrong.items():
        assert cells, f"{name} replaces no cell"
        assert set(cells) <= solution_ids, (
            f"{name} names {sorted(set(cells) - solution_ids)}; "
            f"solution cells are {sorted(solution_ids)}"
        )


def test_release_leaves_out_what_a_solution_run_wrote(tmp_path):
    """Running a solution writes its %%program cells (solution code) to programs/: never released."""
    import shutil

    root = tmp_path / "course"
    shutil.copytree(
        ROOT / "solutions" / "lab0",
        root / "solutions" / "lab0",
        ignore=shutil.ignore_patterns("programs"),
    )
    shutil.copy2(ROOT / "nbgrader_config.py", root / "nbgrader_config.py")
    (root / "solutions" / "lab0" / "programs").mkdir()
    (root / "solutions" / "lab0" / "programs" / "lab0_mean.py").write_text(
        "ANSWER = 'solution code'\n"
    )

    labs.release(root, tmp_path / "labs")

    released = [
        p.relative_to(tmp_path / "labs") for p in (tmp_path / "labs").rglob("*") if p.is_file()
    ]
    assert Path("lab0/lab0.ipynb") in released
    assert not [p for p in released if "programs" in p.parts], released
