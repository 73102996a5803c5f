"""A notebook is read before it runs: learner code that reaches the grader is not run.

nbgrader counts a test as failed only when the kernel reports an error, so a
learner's cell that switches the tests off (an IPython AST transformer wrapping
every later cell in ``try/except``) would score full marks. The guard reads every
learner cell first (``helpers.course.grading.scanner.scan``) and changes what the kernel is
sent, in ``nbgrader autograde`` and in Validate alike:

* a learner cell with a refused construct is not run: the kernel gets
  ``raise SolutionRefused("line 3: get_ipython: ...")`` in its place;
* if a construct reaches the grader (a "grader" refusal), no test is run either:
  every graded cell raises ``SubmissionRefused`` naming the cell and the line, and the
  other cells are skipped (the notebook scores zero, quickly).

The cell keeps its own source in the notebook (the kernel got the replacement
only), so the autograded notebook, the feedback and Validate's report show the
learner's code with the refusal as its error.

Learner code is every code cell that is not one of the lab's locked or graded
cells (which nbgrader restores before grading): solution cells, cells a learner
added, and the lab's other unlocked cells. Cells tagged ``demo`` are skipped by
nbgrader, so what they hold never runs and is not read.

What each lab refuses to import is declared in ``solutions/<lab>/grading.toml``
(released with the lab, so Validate knows it; autograde uses the instructor's
copy, which nbgrader puts next to every submission)::

    [refuse.imports]
    "helpers.parallel.tensor.tp" = "the workbook's own column and row layers: lab 4 asks you to write them"

``configure(c)`` in nbgrader_config.py installs the guard (nbclient's cell hooks on
nbgrader's ``Execute``, and ``GuardLab`` before it in autograde). It also makes nbgrader
skip the demonstration cells (tag ``demo``): they are not graded and repeat what the tests
do. A tag on one of the lab's own cells is removed first: nbclient skips a tagged cell,
and a graded cell that never ran would count as passed.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from helpers.course.grading.lab_policy import (
    DEMO_TAG,
    GRADING_FILE,
    is_lab_cell,
    lab_imports,
    learner_cells,
    nbgrader_meta,
    policy_for,
)
from helpers.course.grading.refusals import Refusal
from helpers.course.grading.scanner import scan

__all__ = [
    "DEMO_TAG",
    "GRADING_FILE",
    "Plan",
    "configure",
    "is_lab_cell",
    "lab_imports",
    "learner_cells",
    "plan",
    "policy_for",
]


@dataclass
class Plan:
    """What the kernel is sent instead of a cell's source, and why."""

    refused: dict[int, list[Refusal]] = field(default_factory=dict)  # cell index -> refusals
    names: dict[int, str] = field(default_factory=dict)  # cell index -> how to name the cell

    @property
    def grader(self) -> list[tuple[int, Refusal]]:
        return [(i, r) for i, rs in self.refused.items() for r in rs if r.grader]

    def summary(self) -> str:
        return "; ".join(f"{self.names[i]} {r}" for i, rs in self.refused.items() for r in rs)

    def replacement(self, index: int, cell) -> str | None:
        """The code the kernel runs instead of cell ``index`` (None: its own source)."""
        if self.grader:
            if nbgrader_meta(cell).get("grade"):
                lines = [f"{self.names[i]} {r}" for i, r in self.grader]
                return _raise(
                    "SubmissionRefused",
                    "no test was run: this notebook reaches into the grader, so none of its "
                    "results can be trusted.",
                    [*lines, "Remove it and validate again."],
                )
            return "pass  # not run: the notebook was refused (see the graded cells)"
        if index in self.refused:
            lines = [str(r) for r in self.refused[index]]
            return _raise("SolutionRefused", f"{self.names[index]} was not run:", lines)
        return None


def _raise(kind: str, headline: str, lines: list[str]) -> str:
    """Code that raises ``kind`` with a message short lines long (Validate cuts long ones)."""
    wrapped = [textwrap.fill(line, 84, subsequent_indent="    ") for line in lines]
    message = "\n".join([headline, *wrapped])
    return f"from helpers.course.grading.refusals import {kind}\nraise {kind}({message!r})"


def _cell_name(nb, index: int) -> str:
    grade_id = nbgrader_meta(nb.cells[index]).get("grade_id")
    return f"cell {grade_id!r}" if grade_id else f"cell {index + 1}"


def plan(nb, directory: Path | None) -> Plan:
    """Scan every learner cell of ``nb`` (a lab notebook in ``directory``)."""
    policy = policy_for(nb, directory)
    out = Plan()
    for i in learner_cells(nb):
        found = scan(nb.cells[i].source, policy)
        if found:
            out.refused[i] = found
            out.names[i] = _cell_name(nb, i)
    return out


# --------------------------------------------------------------------------- nbgrader glue


class _Guard:
    """nbclient's hooks: plan at notebook start, swap a cell's source around its execution."""

    def __init__(self) -> None:
        self.pending: tuple[object, Path] | None = None  # (notebook, lab directory) from GuardLab
        self.plan = Plan()
        self.nb = None
        self.saved: dict[int, str] = {}

    def on_notebook_start(self, notebook, **_) -> None:
        directory = Path.cwd()  # Validate runs in the notebook's directory
        if self.pending is not None and self.pending[0] is notebook:
            directory = self.pending[1]
        self.pending, self.nb, self.saved = None, notebook, {}
        for cell in notebook.cells:
            if is_lab_cell(cell):  # a tag that skips a test cell would make it pass unrun
                cell.metadata.pop("tags", None)
        self.plan = plan(notebook, directory)

    def on_cell_execute(self, cell, cell_index, **_) -> None:
        if (
            self.nb is None
            or cell_index >= len(self.nb.cells)
            or self.nb.cells[cell_index] is not cell
        ):
            return
        code = self.plan.replacement(cell_index, cell)
        if code is not None:
            self.saved[cell_index] = cell.source
            cell.source = code

    def on_cell_complete(self, cell, cell_index, **_) -> None:
        if cell_index in self.saved:  # the kernel has the replacement: the notebook keeps its own
            cell.source = self.saved.pop(cell_index)


GUARD = _Guard()


# nbclient's hooks. Module functions, not GUARD's bound methods: traitlets deep-copies the
# configured values, and a copied guard would not share the plan between the hooks.
def on_notebook_start(notebook, **kwargs) -> None:
    GUARD.on_notebook_start(notebook, **kwargs)


def on_cell_execute(cell, cell_index, **kwargs) -> None:
    GUARD.on_cell_execute(cell, cell_index, **kwargs)


def on_cell_complete(cell, cell_index, **kwargs) -> None:
    GUARD.on_cell_complete(cell, cell_index, **kwargs)


def guard_lab_preprocessor():
    """nbgrader preprocessor class for autograde: tells the guard where the lab's files are."""
    from nbgrader.preprocessors import NbGraderPreprocessor

    class GuardLab(NbGraderPreprocessor):
        """Autograde: the lab's grading.toml is the instructor's copy next to the submission."""

        def preprocess(self, nb, resources):
            path = resources.get("metadata", {}).get("path") or "."
            GUARD.pending = (nb, Path(path))
            return nb, resources

    return GuardLab


def configure(c) -> None:
    """Install the guard in an nbgrader configuration ``c`` (autograde and Validate)."""
    from nbgrader.converters.autograde import Autograde
    from nbgrader.preprocessors import Execute

    c.Execute.skip_cells_with_tag = DEMO_TAG
    c.Execute.on_notebook_start = on_notebook_start
    c.Execute.on_cell_execute = on_cell_execute
    c.Execute.on_cell_complete = on_cell_complete
    steps = list(Autograde.class_traits()["autograde_preprocessors"].default())
    steps.insert(steps.index(Execute), guard_lab_preprocessor())
    c.Autograde.autograde_preprocessors = steps
