"""A learner's Validate button, in a real JupyterLab driven through chromium.

The learner opens the released lab 0, presses Validate and is told the lab does
not pass; types the answers into the solution cells (as text, the way a paste
does), presses Validate again and sees nbgrader's success message. The stub's
failures on several ranks say "all N ranks raised NotImplementedError" and show the
rank's traceback, with no frames of helpers/launch. Then a line that reaches into the
kernel is added to an answer: Validate names the construct and its line, and says no
test was run (the workbook's nbgrader_config.py is in the server's directory, as in a
checkout's `make lab`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest

from helpers.course.grading import roundtrip as grading

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
RELEASED = "labs/lab0/lab0.ipynb"
SOLUTION = "solutions/lab0/lab0.ipynb"
SUCCESS = "Success! Your notebook passes all the tests."


def _validate(page) -> str:
    """Press Validate; return the text of the dialog nbgrader shows, then close it."""
    page.locator(".validate-button").first.click()
    dialog = page.locator(".jp-Dialog").first
    dialog.wait_for(timeout=240_000)
    # While nbgrader runs the notebook the button reads "Validating..."; the dialog
    # appears when it is done.
    text = dialog.inner_text()
    dialog.locator(".jp-Dialog-button").last.click()
    dialog.wait_for(state="detached", timeout=10_000)
    return text


def _type_answers(page, released, solution) -> int:
    answers = {
        c.metadata["nbgrader"]["grade_id"]: grading.solution_source(c.source)
        for c in solution.cells
        if c.metadata.get("nbgrader", {}).get("solution")
    }
    cells = page.locator(".jp-Notebook .jp-Cell")
    typed = 0
    for i, cell in enumerate(released.cells):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers and cell.cell_type == "code":
            editor = cells.nth(i).locator(".cm-content").first
            editor.scroll_into_view_if_needed()
            editor.click()
            page.keyboard.press("Control+a")
            page.keyboard.insert_text(answers[grade_id])  # no auto-indent, like a paste
            typed += 1
    return typed


def _set_cell(page, index: int, text: str) -> None:
    editor = page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".cm-content").first
    editor.scroll_into_view_if_needed()
    editor.click()
    page.keyboard.press("Control+a")
    page.keyboard.insert_text(text)


def test_validate_fails_on_the_stub_and_passes_once_answered(lab, lab_server, page):
    # The checkout's grading configuration and lab 0's refused imports, as `make lab` has them.
    shutil.copy(REPO / "nbgrader_config.py", lab_server.root / "nbgrader_config.py")
    shutil.copy(REPO / "labs" / "lab0" / "grading.toml", lab_server.root / "grading.toml")
    name = lab_server.copy(RELEASED)
    lab.open(name)
    stub = _validate(page)
    assert SUCCESS not in stub, stub
    assert "fail" in stub.lower() or "error" in stub.lower(), stub
    # A failure on the ranks reads as the rank's own error, not the launcher's internals.
    assert "ranks raised NotImplementedError" in stub and "Traceback from rank" in stub, stub
    assert "helpers/launch" not in stub and "pool.py" not in stub, stub

    released = nbformat.read(lab_server.root / name, as_version=4)
    solution = nbformat.read(REPO / SOLUTION, as_version=4)
    assert _type_answers(page, released, solution) > 0
    answered = _validate(page)
    lab.screenshot(page.locator(".jp-Notebook").first, "validate_after_answers.png")
    assert SUCCESS in answered, answered

    # A line that reaches into the kernel: no test runs, and Validate says which line.
    first = next(i for i, c in enumerate(released.cells)
                 if c.metadata.get("nbgrader", {}).get("grade_id") == "shard_range")  # fmt: skip
    answer = grading.solution_source(solution.cells[first].source)
    _set_cell(page, first, answer + "\n\nget_ipython().ast_transformers.clear()")
    refused = _validate(page)
    assert SUCCESS not in refused and "SubmissionRefused" in refused, refused
    line = answer.count("\n") + 3
    assert f"line {line}: get_ipython" in refused and "no test was run" in refused, refused
    assert not [e for e in page.console_errors if "nbgrader" in e.lower()], page.console_errors
