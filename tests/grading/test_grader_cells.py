"""The notebook as the grader reads it: the parameters cell as data, learner names in any style.

Fast checks of helpers.course.grading.grader.cells and .parameters (no sandbox, no
nbgrader run): what a parameters cell may hold and what the grader makes of the rest, the
names the tests see as the learner's however the learner bound them, what of the lab's own
cells the sandbox gets, and that each lab's grading.toml holds its parameters cell's values.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from helpers.course.grading import labs
from helpers.course.grading.grader import parameters as params
from helpers.course.grading.grader.cells import _defined_names, _definitions, learner_program, split
from helpers.course.grading.grader.lab import Lab, lab_of

ROOT = Path(__file__).resolve().parents[2]
LAB = Lab(
    refused={"helpers.parallel.sharded.zero": "lab 2 asks you to write it"},
    parameters={"SMOKE": False},
    grader_only=frozenset({"setup_reference"}),
)


def _lab_cell(grade_id: str, source: str, test: bool = False):
    meta = {"grade_id": grade_id, "locked": True, "grade": test, "solution": False}
    if test:
        meta["points"] = 1
    return new_code_cell(source, metadata={"nbgrader": meta})


def _solution(grade_id: str, source: str):
    meta = {"grade_id": grade_id, "locked": False, "grade": False, "solution": True}
    return new_code_cell(source, metadata={"nbgrader": meta})


def _notebook(parameters: str, answer: str = "def shard_range(n, r, w):\n    return range(0)"):
    return new_notebook(
        cells=[
            new_code_cell(parameters, metadata={"tags": ["parameters"]}),
            _lab_cell(
                "imports",
                "import torch\nfrom helpers.parallel.sharded.zero import ZeroOptimizer\n"
                "WORLD_SIZE = 2 if SMOKE else 4",
            ),
            _lab_cell("setup_reference", "def reference(n):\n    return n"),
            _solution("answer", answer),
            _lab_cell("test_answer", "assert shard_range(4, 0, 2) == range(0, 2)", test=True),
        ]
    )


ATTACKS = {
    "function": "SMOKE = False\n\ndef shard_range(n, r, w):\n    return reference(n)",
    "class body": (
        "import torch\n\nclass Patch:\n"
        "    run = torch.importlib.import_module('helpers.course.grading.grader.run')\n"
        "    run._run_cell = lambda code, name, ns: ('', None)"
    ),
    "call": "SMOKE = bool(__import__('os').system('true'))",
    "patch": "import torch\ntorch.equal = lambda *a: True",
    "other name": "SMOKE = False\nreference = 1",
    "other type": "SMOKE = 'yes'",
    "two targets": "SMOKE = HIDDEN = True",
    "cell magic": "%%bash\necho hi",
}


@pytest.mark.parametrize("name", ATTACKS)
def test_a_parameters_cell_that_is_not_data_is_refused_and_the_instructors_values_used(name):
    parts = split(_notebook(ATTACKS[name]), LAB)
    message = parts.parameter_errors[0]
    assert "cell 1 was not used" in message and "line " in message, message
    assert "a parameters cell holds only assignments of literal values to SMOKE" in message
    assert parts.parameters == {"SMOKE": False}  # the grader's namespace: the instructor's
    (sandboxed,) = [c for c in parts.learner if c.index == 0]
    assert sandboxed.source == "SMOKE = False\n"  # the sandbox too: values, not the text
    assert "Patch" not in parts.learner_names and "reference" not in parts.learner_names


def test_a_literal_parameter_is_read_never_run():
    parts = split(_notebook("# comment\nSMOKE = True  # quick\n%matplotlib inline"), LAB)
    assert parts.parameter_errors == {} and parts.parameters == {"SMOKE": True}
    assert [c.source for c in parts.learner if c.index == 0] == ["SMOKE = True\n"]
    got = params.read("SMOKE: bool = True\n'a note'", {"SMOKE": False, "STEPS": 1.5})
    assert got.values == {"SMOKE": True} and not got.problems
    assert params.read("STEPS = 3", {"STEPS": 1.5}).values == {"STEPS": 3}  # an int for a float


def test_a_papermill_injected_cell_is_read_as_data_too():
    nb = _notebook("SMOKE = False")
    nb.cells.insert(1, new_code_cell("SMOKE = True", metadata={"tags": ["injected-parameters"]}))
    assert split(nb, LAB).parameters == {"SMOKE": True}
    nb.cells[1].source = "def f():\n    pass"
    parts = split(nb, LAB)
    assert parts.parameters == {"SMOKE": False} and 1 in parts.parameter_errors


STYLES = {
    "tuple assignment": ("f, g = (lambda: 1), (lambda: 2)", {"f", "g"}),
    "starred": ("a, *rest = [1, 2, 3]", {"a", "rest"}),
    "from import": ("from lab0_shard import shard_range", {"shard_range"}),
    "import as": ("import math as shard_math", {"shard_math"}),
    "for target": ("for name in 'ab':\n    pass", {"name"}),
    "with target": (
        "import contextlib\nwith contextlib.nullcontext(1) as kept:\n    pass",
        {"kept"},
    ),
    "walrus": ("if (found := 3):\n    pass", {"found"}),
    "global in a function": ("def setup():\n    global table\n    table = {}", {"table"}),
    "partial": ("import functools\nshard = functools.partial(min, 3)", {"shard"}),
}


@pytest.mark.parametrize("style", STYLES)
def test_every_name_a_learner_binds_is_the_learners(style):
    source, names = STYLES[style]
    assert names <= _defined_names(source)


def test_builtins_and_special_names_are_never_the_learners():
    answer = "def all(xs):\n    return True\n\n__builtins__ = {}\nshard_range = len"
    parts = split(_notebook("SMOKE = False", answer), LAB)
    assert parts.learner_names == {"shard_range"}, parts.learner_names


def test_another_cell_keeps_what_it_defines_and_drops_what_it_runs():
    kept = _definitions(
        "import functools\nf, g = min, max\nh = functools.partial(min, 1)\nk = lambda x: x\n"
        "N = 2 ** 10\nout = spawn(work, 4)\nprint(out)\ndef helper():\n    return out"
    )
    tree = ast.parse(kept)
    names = [ast.unparse(n).split(" =")[0].split("(")[0] for n in tree.body]
    assert names == ["import functools", "f, g", "h", "k", "N", "def helper"], names


def test_the_sandbox_gets_no_grader_only_cell_and_no_refused_import():
    parts = split(_notebook("SMOKE = False"), LAB)
    sandboxed = {c.index: c.source for c in parts.learner}
    assert 2 not in sandboxed  # setup_reference: the grader's only
    assert "zero" not in sandboxed[1] and "import torch" in sandboxed[1]
    assert [c.index for c in parts.lab] == [1, 2]  # the grader runs both
    assert "def reference" not in learner_program(parts)


@pytest.mark.parametrize("lab", labs.lab_names(ROOT))
def test_grading_toml_holds_the_solutions_parameters(lab):
    nb = nbformat.read(ROOT / "solutions" / lab / f"{lab}.ipynb", as_version=4)
    (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    values = {
        n.targets[0].id: ast.literal_eval(n.value)
        for n in ast.parse(cell.source).body
        if isinstance(n, ast.Assign)
    }
    instructor = lab_of(ROOT / "solutions" / lab).parameters
    assert instructor == values, f"solutions/{lab}/grading.toml [parameters] != the cell"
    assert params.read(cell.source, instructor).problems == []
    for grade_id in lab_of(ROOT / "solutions" / lab).grader_only:
        assert any(c.metadata.get("nbgrader", {}).get("grade_id") == grade_id for c in nb.cells)


# A parameters cell that defines a function (named as an answer), a class whose body patches
# the grader, and a patch of torch: on 7718dfa all three ran in the grader's process.
NOT_DATA = (
    "SMOKE = True\nimport torch\n\n\ndef helper():\n    return 1\n\n\nclass Patch:\n"
    "    run = torch.importlib.import_module('helpers.course.grading.grader.run')\n"
    "    run._run_cell = lambda code, name, ns: ('', None)\n\n\ntorch.equal = lambda *a: True\n"
)


@pytest.mark.parametrize("lab", labs.lab_names(ROOT))
def test_each_labs_parameters_cell_is_data_and_refused_when_it_is_not(lab):
    """Each released lab, its parameters cell replaced: refused with what the cell may hold
    (every line that is not data named), and the grader and the sandbox both get the
    instructor's values, not the text (test_grader_boundary.py grades it: stubs score 0)."""
    nb = nbformat.read(ROOT / "labs" / lab / f"{lab}.ipynb", as_version=4)
    (index,) = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    nb.cells[index].source = NOT_DATA
    instructor = lab_of(ROOT / "solutions" / lab)
    parts = split(nb, instructor)
    message = parts.parameter_errors[index]
    for line in (2, 5, 9, 14):  # the import, the function, the class, the patch
        assert f"line {line}: " in message, message
    assert "a parameters cell holds only assignments of literal values to SMOKE" in message
    assert "no function, class, import, call or other name" in message
    assert parts.parameters == instructor.parameters == {"SMOKE": False}
    (sandboxed,) = [c.source for c in parts.learner if c.index == index]
    assert sandboxed == params.as_source(instructor.parameters)  # SMOKE = False, no text
    assert not {"helper", "Patch", "torch"} & parts.learner_names
    nb.cells[index].source = "SMOKE = True  # quick, while I work\n"  # data: read, not refused
    assert split(nb, instructor).parameters == {"SMOKE": True}


def test_autograde_takes_each_lab_cells_role_from_the_gradebook(monkeypatch):
    """A submission that switched a hidden test's `grade` flag off (nbgrader's OverwriteCells
    restores a locked cell's source and lock, not that flag) and made its solution cell look
    like a locked setup cell: the grader would have run the test as setup code, in the
    sandbox too, and the learner's cell in its own process. The gradebook says otherwise.
    (The gradebook here is a stand-in with nbgrader's API; every autograde round trip reads
    the real one through the same calls.)"""
    from types import SimpleNamespace as Record

    import nbgrader.api

    from helpers.course.grading.grader.preprocessor import restore_roles

    nb = _notebook("SMOKE = False")
    metas = [c.metadata["nbgrader"] for c in nb.cells[1:]]
    recorded = Record(  # what `nbgrader generate_assignment` recorded
        grade_cells=[Record(name=m["grade_id"], max_score=1) for m in metas if m["grade"]],
        solution_cells=[Record(name=m["grade_id"]) for m in metas if m["solution"]],
        source_cells=[Record(name=m["grade_id"], locked=m["locked"]) for m in metas],
    )

    class Book:
        def __init__(self, url):
            assert url == "sqlite:///gradebook.db"

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def find_notebook(self, notebook, assignment):
            assert (notebook, assignment) == ("lab", "lab")
            return recorded

    monkeypatch.setattr(nbgrader.api, "Gradebook", Book)
    nb.cells[4].metadata["nbgrader"].update(grade=False, points=0)  # the test, switched off
    nb.cells[3].metadata["nbgrader"].update(solution=False, locked=True)  # "a setup cell"
    tampered = split(nb, LAB)
    assert [c.index for c in tampered.lab] == [1, 2, 3, 4] and tampered.tests == []
    info = {"db_url": "sqlite:///gradebook.db", "notebook": "lab", "assignment": "lab"}
    restore_roles(nb, {"nbgrader": info})
    parts = split(nb, LAB)
    assert [c.index for c in parts.tests] == [4] and [c.index for c in parts.lab] == [1, 2]
    assert 3 in {c.index for c in parts.learner} and parts.learner_names == {"shard_range"}
    assert nb.cells[4].metadata["nbgrader"]["points"] == 1
    restore_roles(nb, {})  # Validate: no gradebook, nothing to restore
