"""nbgrader preprocessors that keep a class's grading honest and robust.

``nbgrader_config.py`` plugs them into nbgrader's pipelines.

Feedback that never shows hidden tests (``HideHiddenTests``).

nbgrader's autograde puts the hidden tests back into each submission to run
them, and ``generate_feedback`` renders that autograded notebook as it is: the
hidden tests' code, and the traceback of a failing one (which quotes the failing
line), would reach the learner. ``nbgrader_config.py`` adds this preprocessor to
``GenerateFeedback`` after ``GetGrades`` (which reads the scores by cell id):

* the hidden region is cut from every test cell (nbgrader's ClearHiddenTests);
* a failing cell that had hidden tests keeps only the exception's type and
  message, never the traceback: messages are written for learners, code is not.
"""

from __future__ import annotations

from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import ClearHiddenTests, DeduplicateIds

__all__ = ["DropDuplicateIds", "HideHiddenTests"]


class DropDuplicateIds(DeduplicateIds):
    """A graded cell copied in JupyterLab must not stop the grading of the whole class.

    A copy carries the original's nbgrader metadata, so two cells share a grade_id.
    nbgrader's DeduplicateIds keeps the last one and sets the others' metadata to
    ``{}``; an empty dict has no schema version, so nbgrader then takes the notebook
    for an old format and aborts the batch (every learner after this one goes
    ungraded). Dropping the key instead makes the copy a plain cell.
    """

    def preprocess_cell(self, cell: NotebookNode, resources: dict, cell_index: int):
        cell, resources = super().preprocess_cell(cell, resources, cell_index)
        if cell.metadata.get("nbgrader") == {}:
            del cell.metadata["nbgrader"]
        return cell, resources


class HideHiddenTests(ClearHiddenTests):
    """ClearHiddenTests for feedback: also reduce those cells' errors to their message."""

    def preprocess_cell(self, cell: NotebookNode, resources: dict, cell_index: int):
        had_hidden = cell.cell_type == "code" and self.begin_test_delimeter in cell.source
        cell, resources = super().preprocess_cell(cell, resources, cell_index)
        if had_hidden:
            cell.outputs = [_message_only(o) for o in cell.get("outputs", [])]
        return cell, resources


def _message_only(output: NotebookNode) -> NotebookNode:
    if output.get("output_type") != "error":
        return output
    # `traceback` is the list of (ANSI-coloured) lines the HTML shows; keep one line.
    output.traceback = [f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"]
    return output
