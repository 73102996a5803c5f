"""Run a lab's tests in the grader's own process, with the learner's code only in the sandbox.

``grade(nb, directory, pool)`` returns, for each code cell that gets outputs, the outputs
the grader decided: a test cell's printed lines and, when it failed, its error; a learner
cell's error when the guard refused it or it raised in the sandbox. nbgrader's
``GetGrades`` / ``SaveAutoGrades`` (and Validate) then score the notebook from those
outputs, exactly as they would from a kernel's.

What runs where:

* in this process: the lab's locked cells (imports, setup tools, the reference functions)
  and every test cell, hidden parts included, in a namespace that holds the parameters'
  values (read as data, ``grader.parameters``: no learner text runs here), where each
  learner name is a ``LearnerRef`` and ``spawn`` starts sandboxed ranks;
* in the sandbox (``pool``): the learner's cells, which the ranks and the learner process
  load before they run what a test asks of them, in a sandbox where the modules the lab
  refuses (its grading.toml) are absent. Values come back as data.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
import traceback
from pathlib import Path

from nbformat.v4 import new_output

from helpers.course.grading import guard
from helpers.course.grading.grader.cells import Parts, is_parameters_cell, learner_program, split
from helpers.course.grading.grader.lab import lab_of
from helpers.course.grading.grader.proxies import LearnerRef
from helpers.launch.spawn import routed

__all__ = ["grade"]


def _error(exc: BaseException, cell_name: str | None = None) -> dict:
    """An nbformat error output: the exception and the line of the test that raised it."""
    where = []
    for frame in traceback.extract_tb(exc.__traceback__):
        if cell_name and frame.filename == f"<{cell_name}>":
            where = [f"{cell_name}, line {frame.lineno}: {frame.line or ''}".rstrip()]
    ename, evalue = type(exc).__name__, str(exc)
    render = getattr(exc, "_render_traceback_", None)  # a rank's failure: as IPython shows it
    shown = render() if callable(render) else [f"{ename}: {evalue}"]
    return new_output("error", ename=ename, evalue=evalue, traceback=[*where, *shown])


def _named_error(ename: str, message: str) -> dict:
    """An error output whose traceback (what Validate and feedback show) names its kind."""
    return new_output("error", ename=ename, evalue=message, traceback=[f"{ename}: {message}"])


def _stream(text: str) -> list[dict]:
    return [new_output("stream", name="stdout", text=text)] if text else []


def _refused(nb, directory: Path) -> tuple[dict[int, list], set[int], str | None]:
    """The guard's plan: errors for refused learner cells, and the verdict for all tests
    when the notebook reaches into the grader."""
    plan = guard.plan(nb, directory)
    for i in [i for i in plan.refused if is_parameters_cell(nb.cells[i])]:
        del plan.refused[i]  # data, never run: grader.parameters reads it
    outputs = {}
    for i, refusals in plan.refused.items():
        msg = "\n".join([f"{plan.names[i]} was not run:", *map(str, refusals)])
        outputs[i] = [_named_error("SolutionRefused", msg)]
    whole = None
    if plan.grader:
        whole = "\n".join(
            [
                "no test was run: this notebook reaches into the grader, so none of its results "
                "can be trusted.",
                *(f"{plan.names[i]} {r}" for i, r in plan.grader),
                "Remove it and validate again.",
            ]
        )
    return outputs, set(plan.refused), whole


def _namespace(parts: Parts, call) -> dict:
    """The tests' namespace: the parameters' values (literals, never learner text) and a
    reference for each learner name."""
    ns: dict = {"__name__": "__grader__", "__builtins__": __builtins__}
    ns.update(parts.parameters)
    for name in parts.learner_names:
        ns[name] = LearnerRef(name, call)
    return ns


def _run_cell(code: str, name: str, ns: dict) -> tuple[str, BaseException | None]:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            exec(compile(code, f"<{name}>", "exec"), ns)
    except Exception as e:  # noqa: BLE001 - a failed test is an outcome, not a crash
        return out.getvalue(), e
    return out.getvalue(), None


def grade(
    nb, directory: Path, pool, guard_first: bool = True, seconds: dict | None = None
) -> dict[int, list]:
    """Outputs per cell index, decided here (see the module docstring). ``guard_first=False``
    skips the guard (tests use it to show that the sandbox alone holds); ``seconds``, when
    given, gets each test cell's time by cell index."""
    outputs, skip, whole = _refused(nb, Path(directory)) if guard_first else ({}, set(), None)
    lab = lab_of(Path(directory))
    parts = split(nb, lab, skip)
    for index, message in parts.parameter_errors.items():
        outputs[index] = [_named_error("ParametersRefused", message)]
    if whole is not None:
        for cell in parts.tests:
            outputs[cell.index] = [_named_error("SubmissionRefused", whole)]
        return outputs
    source, programs, refused = learner_program(parts), parts.programs, tuple(lab.refused)

    def call(name, *args, **kwargs):
        return pool.call(
            name, *args, learner_source=source, programs=programs, refused=refused, **kwargs
        )

    def ranks(fn, world_size, args, timeout):
        return pool.spawn(
            fn,
            world_size,
            args,
            learner_source=source,
            programs=programs,
            refused=refused,
            timeout=timeout,
        )

    try:
        for index, message in call("__workbook_cell_errors__"):
            outputs.setdefault(index, []).append(_named_error("LearnerCellError", message))
    except Exception as e:  # noqa: BLE001 - the learner process could not start: every test says why
        for cell in parts.tests:
            outputs[cell.index] = [_error(e)]
        return outputs
    ns = _namespace(parts, call)
    tests = {cell.index for cell in parts.tests}
    with routed(ranks):  # notebook order: a later setup cell may redefine what a test rebound
        for cell in sorted(parts.lab + parts.tests, key=lambda c: c.index):
            start = time.perf_counter()
            text, exc = _run_cell(cell.source, cell.name, ns)
            if seconds is not None and cell.index in tests:
                seconds[cell.index] = time.perf_counter() - start
            if cell.index in tests:
                outputs[cell.index] = _stream(text) + ([_error(exc, cell.name)] if exc else [])
            elif exc is not None:  # the lab's own code failed: the tests that need it will say so
                sys.stderr.write(f"grader: {cell.name} raised {exc!r}\n")
    return outputs
