"""Unit tests of the pieces of helpers.course.grading.labs that build fake submissions."""

from __future__ import annotations

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from helpers.course.grading import roundtrip as grading


def _solution_cell(grade_id: str, source: str):
    cell = new_code_cell(source)
    cell.metadata["nbgrader"] = {
        "grade_id": grade_id,
        "solution": True,
        "grade": False,
        "locked": False,
        "schema_version": 3,
    }
    return cell


def test_solution_source_removes_only_the_markers():
    src = "def f(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION\n"
    assert grading.solution_source(src) == "def f(x):\n    return 2 * x"


def test_one_wrong_answer_is_split_by_cell_headers(tmp_path):
    (tmp_path / grading.WRONG_ANSWERS).write_text(
        "# a comment for the reader\n\n"
        "# %% cell: first\ndef f(x):\n    return x\n\n"
        "# %% cell: second\nY = 3\n"
    )
    assert grading.wrong_answers(tmp_path) == {
        "wrong": {"first": "def f(x):\n    return x", "second": "Y = 3"}
    }


def test_several_wrong_answers_become_several_students(tmp_path):
    (tmp_path / grading.WRONG_ANSWERS).write_text(
        "# comments\n"
        "# === wrong: halves\n# %% cell: f\ndef f(x):\n    return x / 2\n"
        "# === wrong: both\n# %% cell: f\ndef f(x):\n    return x\n# %% cell: g\nY = 0\n"
    )
    assert grading.wrong_answers(tmp_path) == {
        "wrong-halves": {"f": "def f(x):\n    return x / 2"},
        "wrong-both": {"f": "def f(x):\n    return x", "g": "Y = 0"},
    }
    assert grading.students(tmp_path) == ["release", "solution", "wrong-halves", "wrong-both"]


def test_missing_or_headerless_wrong_answers_say_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="add plausible wrong answers"):
        grading.wrong_answers(tmp_path)
    (tmp_path / grading.WRONG_ANSWERS).write_text("def f(x):\n    return x\n")
    with pytest.raises(ValueError, match="# %% cell: <grade_id>"):
        grading.wrong_answers(tmp_path)


def test_fill_in_answers_solution_cells_only():
    solution = new_notebook(
        cells=[
            new_code_cell("import math"),
            _solution_cell(
                "f", "def f(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION"
            ),
            _solution_cell(
                "g", "def g():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION"
            ),
        ]
    )
    released = nbformat.from_dict(solution)
    for cell in released.cells[1:]:
        cell.source = cell.source.split("\n")[0] + "\n    raise NotImplementedError()"
    right = grading.fill_in(released, solution, {})
    assert right.cells[1].source == "def f(x):\n    return 2 * x"
    assert right.cells[2].source == "def g():\n    return 1"
    wrong = grading.fill_in(released, solution, {"f": "def f(x):\n    return x"})
    assert wrong.cells[1].source == "def f(x):\n    return x"
    assert wrong.cells[2].source == "def g():\n    return 1"
    assert wrong.cells[0].source == "import math"
    # The release itself is not modified.
    assert "NotImplementedError" in released.cells[1].source
