"""A lab's parameters cell is data: literal assignments of the instructor's names, never run.

A lab notebook has a cell tagged ``parameters`` (papermill's; ``injected-parameters`` is
the cell papermill adds after it), and it is not locked: a learner may set ``SMOKE = True``
while working. The grader never executes it. It reads the cell's syntax tree and keeps each
statement of the form ``NAME = literal`` (or ``NAME: type = literal``) whose NAME the
instructor's parameters define and whose value, read with ``ast.literal_eval``, has the
type of the instructor's value. Anything else (a function, a class, an import, a call, an
attribute, another name, a value of another type) is refused: the cell gets an error that
says what a parameters cell may hold, and the lab is graded as if the cell held the
instructor's values. The grader and the sandbox both get the values, never the text.

The instructor's values are the lab's ``grading.toml`` ``[parameters]`` table, the
instructor's copy in autograde (nbgrader copies the lab's files over the submission's);
tests/grading/test_grader_cells.py checks that it matches each solution notebook's cell.

    read(source, instructor) -> Parameters(values, problems)
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from helpers.course.grading.grader.magics import python_of

__all__ = ["PARAMETER_TAGS", "Parameters", "as_source", "read", "what_it_may_hold"]

# papermill's tag for the lab's cell, and for the cell papermill inserts after it
PARAMETER_TAGS = ("parameters", "injected-parameters")


@dataclass
class Parameters:
    values: dict = field(default_factory=dict)  # the names the cell set, as literals
    problems: list[str] = field(default_factory=list)  # "line N: ...": what was refused


def _same_kind(value, want) -> bool:
    if isinstance(want, bool) or isinstance(value, bool):
        return type(value) is type(want)
    if isinstance(want, float):
        return isinstance(value, int | float)
    return type(value) is type(want)


def what_it_may_hold(instructor: dict) -> str:
    """The sentence a refusal ends with: the names and the kind of value each takes."""
    if not instructor:
        return "this lab's parameters cell sets nothing the grader reads: leave it as released"
    names = ", ".join(f"{k} = {v!r} ({type(v).__name__})" for k, v in instructor.items())
    return (
        f"a parameters cell holds only assignments of literal values to {names}, one per "
        "line: no function, class, import, call or other name. The lab was graded with "
        f"the instructor's values ({as_source(instructor).strip().replace(chr(10), '; ')})"
    )


def _statement(node: ast.stmt, instructor: dict) -> tuple[str | None, object, str | None]:
    """(name, value, None) for an accepted assignment, (None, None, why) otherwise."""
    if isinstance(node, ast.Pass):
        return None, None, None  # what a %magic line became
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return None, None, None  # a bare string: a note to the reader
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target, value = node.targets[0], node.value
    elif isinstance(node, ast.AnnAssign) and node.value is not None and node.simple:
        target, value = node.target, node.value
    else:
        return None, None, f"{ast.unparse(node)[:60]!r} is not an assignment of one name"
    if not isinstance(target, ast.Name):
        return None, None, f"{ast.unparse(target)[:60]!r} is not a plain name"
    if target.id not in instructor:
        return None, None, f"{target.id} is not one of this lab's parameters"
    try:
        literal = ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None, None, f"{target.id} = {ast.unparse(value)[:60]} is not a literal value"
    want = instructor[target.id]
    if not _same_kind(literal, want):
        return (
            None,
            None,
            (f"{target.id} takes a {type(want).__name__}, not a {type(literal).__name__}"),
        )
    return target.id, literal, None


def read(source: str, instructor: dict) -> Parameters:
    """The values a parameters cell sets, and what it holds that the grader refuses."""
    magic, _, code = python_of(source)
    if magic is not None:
        return Parameters(problems=[f"line 1: %%{magic}: a cell magic"])
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        return Parameters(problems=[f"line {getattr(e, 'lineno', 1) or 1}: not Python ({e})"])
    out = Parameters()
    for node in tree.body:
        name, value, why = _statement(node, instructor)
        if why is not None:
            out.problems.append(f"line {node.lineno}: {why}")
        elif name is not None:
            out.values[name] = value
    return out


def as_source(values: dict) -> str:
    """The assignments the sandbox runs in the cell's place (reprs of literals)."""
    return "".join(f"{name} = {value!r}\n" for name, value in values.items())
