"""What the grader takes from the lab's ``grading.toml``: the instructor's word, not the notebook's.

The notebook a learner submits is theirs, its metadata included (nbgrader restores the
locked cells' source, not their tags), so what decides where a cell runs or what a
parameter may be comes from the lab's ``grading.toml``, which autograde takes from the
instructor's copy (nbgrader copies the lab's files over the submission's)::

    [refuse.imports]          # modules the lab refuses: absent from its sandbox too
    "helpers.parallel.sharded.zero" = "the workbook's own ZeRO: lab 2 asks you to write it"

    [parameters]              # the instructor's parameters cell, as data
    SMOKE = false

    [sandbox]                 # lab cells that run in the grader only: the tests' references
    grader_only = ["setup_blocks"]

``lab_of(directory)`` reads it (a lab without the file refuses nothing, has no parameters
and no grader-only cell).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from helpers.course.grading.lab_policy import GRADING_FILE, lab_imports

__all__ = ["Lab", "lab_of"]

_LITERALS = (bool, int, float, str)


@dataclass(frozen=True)
class Lab:
    refused: dict[str, str] = field(default_factory=dict)  # module -> why
    parameters: dict = field(default_factory=dict)  # name -> the instructor's value
    grader_only: frozenset[str] = frozenset()  # grade_ids of cells the sandbox never gets


def lab_of(directory: Path | None) -> Lab:
    """The lab in ``directory`` as its grading.toml describes it (see the module docstring)."""
    path = Path(directory or ".") / GRADING_FILE
    if directory is None or not path.is_file():
        return Lab()
    with path.open("rb") as f:
        data = tomllib.load(f)
    parameters = data.get("parameters", {})
    bad = [k for k, v in parameters.items() if not isinstance(v, _LITERALS)]
    if bad:
        raise ValueError(f"{path}: [parameters] {bad[0]!r} must be a bool, number or string")
    only = data.get("sandbox", {}).get("grader_only", [])
    if not isinstance(only, list) or not all(isinstance(g, str) for g in only):
        raise ValueError(f"{path}: [sandbox] grader_only is a list of cell grade_ids")
    return Lab(
        refused=lab_imports(Path(directory)),
        parameters=dict(parameters),
        grader_only=frozenset(only),
    )
