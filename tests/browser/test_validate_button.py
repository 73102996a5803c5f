"""A learner's Validate button, in a real JupyterLab driven through chromium.

The learner opens the released lab 0, presses Validate and is told the lab does
not pass; types the answers into the solution cells (as text, the way a paste
does), presses Validate again and sees nbgrader's success message. The stub's
failures on several ranks say "all N ranks raised NotImplementedError" and show the
rank's traceback, with no frames of helpers/launch.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from helpers.course import grading

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


def test_validate_fails_on_the_stub_and_passes_once_answered(lab, lab_server, page):
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
    assert not [e for e in page.console_errors if "nbgrader" in e.lower()], page.console_errors
