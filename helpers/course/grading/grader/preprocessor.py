"""nbgrader's step that grades a lab: ``GradeInSandbox`` in place of ``Execute``.

``nbgrader_config.py`` puts it where nbgrader's ``Execute`` was, in autograde and in
Validate, so both give the verdict the grader computed (``run.grade``) and nbgrader stays
the instructor's tool for everything else (assign, collect, autograde's scores and
gradebook, feedback, export). No kernel runs the notebook: the learner's code runs only
in the sandbox (``helpers.course.grading.sandbox``), started once per grading process and
shared by every notebook it grades.
"""

from __future__ import annotations

import atexit
from pathlib import Path

from nbgrader.preprocessors import NbGraderPreprocessor

from helpers.course.grading.grader.run import grade

__all__ = ["GradeInSandbox", "configure", "shared_pool"]

_POOL = []


def shared_pool():
    """The grading process's sandbox pool (started on first use, ended at exit)."""
    if not _POOL:
        from helpers.course.grading.sandbox.pool import SandboxPool

        pool = SandboxPool(course_root=Path.cwd())  # nbgrader runs in the course directory
        atexit.register(pool.close)
        _POOL.append(pool)
    return _POOL[0]


def restore_roles(nb, resources) -> None:
    """Autograde: each lab cell's role as the gradebook records it, not as the submission says.

    nbgrader's OverwriteCells restores a locked cell's source and lock, but not whether it
    is graded or a solution: a learner who turned a hidden test's ``grade`` off would have
    it run as a setup cell, in the sandbox too. Validate has no gradebook (and grades the
    learner's own copy, on the learner's account): nothing to restore there.
    """
    info = resources.get("nbgrader") or {}
    if not info.get("db_url") or not info.get("notebook"):
        return
    from nbgrader.api import Gradebook

    with Gradebook(info["db_url"]) as gb:
        notebook = gb.find_notebook(info["notebook"], info["assignment"])
        points = {c.name: c.max_score for c in notebook.grade_cells}
        solutions = {c.name for c in notebook.solution_cells}
        locked = {c.name: c.locked for c in notebook.source_cells}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader")
        if not meta or meta.get("grade_id") not in locked:
            continue
        name = meta["grade_id"]
        meta.update(grade=name in points, solution=name in solutions, locked=locked[name])
        if name in points:
            meta["points"] = points[name]


class GradeInSandbox(NbGraderPreprocessor):
    """Write every code cell's outputs from the grader's verdict (see the module docstring)."""

    def preprocess(self, nb, resources):
        restore_roles(nb, resources)
        path = Path(resources.get("metadata", {}).get("path") or ".")
        pool = shared_pool()
        try:
            outputs = grade(nb, path, pool)
        finally:
            pool.end_learner()  # the next notebook gets a fresh learner process
        count = 0
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            cell.outputs = outputs.get(i, [])
            count += 1
            cell.execution_count = count if i in outputs else None
        return nb, resources


def configure(c) -> None:
    """Put GradeInSandbox in place of Execute in autograde and Validate (nbgrader config ``c``)."""
    from nbgrader.converters.autograde import Autograde
    from nbgrader.preprocessors import Execute
    from nbgrader.validator import Validator

    def swap(steps):
        return [GradeInSandbox if step is Execute else step for step in steps]

    c.Autograde.autograde_preprocessors = swap(
        Autograde.class_traits()["autograde_preprocessors"].default()
    )
    # nbgrader 0.9 does not let a config set Validator.preprocessors (the trait is not
    # configurable), so Validate's steps are changed where they are defined, in this process.
    trait = Validator.class_traits()["preprocessors"]
    trait.default_args = (swap(trait.default()),)
