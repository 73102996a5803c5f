"""``nbgrader export``'s grades CSV, with a ``refused`` column that says why a notebook lost marks.

The guard (helpers.course.grading.guard) does not run a learner cell that reaches into
the grader or imports what the lab refuses; the kernel reports a
``SolutionRefused`` or ``SubmissionRefused`` error instead, naming the cell, the
line and the construct (and ``ParametersRefused`` on a parameters cell that held more than
literal values: the grader read it as data and used the instructor's values). This exporter writes nbgrader's usual columns and, beside
them, those reasons, read from each learner's autograded notebooks, so the
instructor sees in the spreadsheet why a submission scored what it did::

    nbgrader export --to grades.csv      # nbgrader_config.py selects this exporter

A submission with nothing refused has an empty ``refused`` cell.
"""

from __future__ import annotations

import csv
from pathlib import Path

import nbformat
from nbgrader.api import MissingEntry
from nbgrader.plugins import CsvExportPlugin

__all__ = ["CsvWithRefusals", "refusals_of"]

KEYS = [
    "assignment", "duedate", "timestamp", "student_id", "last_name", "first_name", "email",
    "raw_score", "late_submission_penalty", "score", "max_score", "refused",
]  # fmt: skip
REFUSALS = ("SolutionRefused", "SubmissionRefused", "ParametersRefused")


def refusals_of(directory: Path) -> list[str]:
    """The refusal messages in the autograded notebooks of one submission, each once, in order."""
    found: list[str] = []
    for path in sorted(Path(directory).glob("*.ipynb")):
        try:
            nb = nbformat.read(path, as_version=4)
        except Exception:  # noqa: BLE001 - a notebook nbgrader could not grade has no outputs
            continue
        for cell in nb.cells:
            for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
                if out.get("output_type") == "error" and out.get("ename") in REFUSALS:
                    message = f"{out['ename']}: {out.get('evalue', '')}"
                    if message not in found:
                        found.append(message)
    return found


class CsvWithRefusals(CsvExportPlugin):
    """nbgrader's CSV export plus a ``refused`` column (what the guard did not run, and why)."""

    def export(self, gradebook) -> None:
        dest = self.to or "grades.csv"
        students = [str(s) for s in self.student]
        assignments = [str(a) for a in self.assignment]
        coursedir = self.parent.coursedir
        self.log.info("Exporting grades (with refusals) to %s", dest)
        with open(dest, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=KEYS)
            writer.writeheader()
            for assignment in gradebook.assignments:
                if assignments and assignment.name not in assignments:
                    continue
                for student in gradebook.students:
                    if students and student.id not in students:
                        continue
                    row = self._row(gradebook, assignment, student)
                    graded = coursedir.format_path(
                        coursedir.autograded_directory, student.id, assignment.name
                    )
                    row["refused"] = " | ".join(refusals_of(Path(graded)))
                    writer.writerow({k: "" if v is None else v for k, v in row.items()})

    @staticmethod
    def _row(gradebook, assignment, student) -> dict:
        row = {
            "assignment": assignment.name,
            "duedate": assignment.duedate,
            "student_id": student.id,
            "last_name": student.last_name,
            "first_name": student.first_name,
            "email": student.email,
            "max_score": assignment.max_score,
        }
        try:
            sub = gradebook.find_submission(assignment.name, student.id)
        except MissingEntry:
            row |= {"timestamp": "", "raw_score": 0.0, "late_submission_penalty": 0.0, "score": 0.0}
        else:
            penalty = sub.late_submission_penalty
            row |= {
                "timestamp": sub.timestamp,
                "raw_score": sub.score,
                "late_submission_penalty": penalty,
                "score": max(0.0, sub.score - penalty),
            }
        return row
