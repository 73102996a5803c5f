"""The guard reads learner code before it runs: what it refuses, and what it lets through.

Fast checks of helpers.course.grading.refusals and helpers.course.grading.guard (no kernel, no
nbgrader run). Each bypass below is one a learner looking for free marks would
try; each honest cell is code from the labs' own solutions and must run.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from helpers.course.grading import guard, labs
from helpers.course.grading import roundtrip as grading
from helpers.course.grading.refusals import Policy
from helpers.course.grading.scanner import scan

ROOT = Path(__file__).resolve().parents[2]
POLICY = Policy(
    lab_imports={"helpers.parallel.tensor.tp": "lab 4 asks you to write these layers"},
    protected={"check_training", "WIDTHS"},
    lab_bindings={"torch": "torch", "tdist": "torch.distributed", "spawn": "helpers.launch.spawn"},
    programs={"lab0_shard"},
)

# name -> (learner code, the construct the refusal must name, grader refusal?)
BYPASSES = {
    "ast transformer": (
        "import ast\n\nclass Swallow(ast.NodeTransformer):\n    pass\n\n"
        "get_ipython().ast_transformers.append(Swallow())",
        "get_ipython",
        True,
    ),
    "kernel event": ("ip = get_ipython\nip().events.register('pre_run_cell', print)", "get_ipython", True),
    "line magic": ("%run helper.py", "%run", True),
    "shell": ("!touch x", "!touch x", True),
    "cell magic": ("%%writefile x.py\nprint(1)", "%%writefile", True),
    "sys.modules": ("import sys\nsys.modules['torch'] = None", "import sys", True),
    "settrace": ("import threading\nthreading.settrace(print)", "import threading", True),
    "code swap": ("def f():\n    pass\n\nf.__code__ = (lambda: 1).__code__", ".__code__", True),
    "function type": ("from types import FunctionType", "from types import FunctionType", True),
    "exec": ("exec('x = 1')", "exec", True),
    "dispatch mode": (
        "from torch.utils._python_dispatch import _get_current_dispatch_mode",
        "from torch.utils._python_dispatch import _get_current_dispatch_mode",
        True,
    ),
    "dispatch mode by attribute": (
        "torch.utils._python_dispatch._get_current_dispatch_mode().allow = {'broadcast'}",
        "torch.utils._python_dispatch",
        True,
    ),
    "gc": ("import gc\nobjs = gc.get_objects()", "import gc", True),
    "frames": ("import inspect\nframe = inspect.currentframe()", "import inspect", True),
    "always equal": ("class Answer:\n    def __eq__(self, other):\n        return True", "def __eq__", True),
    "pickle hook": ("class A:\n    def __reduce__(self):\n        return (print, ('x',))", "def __reduce__", True),
    "monkeypatch torch": ("torch.testing.assert_close = lambda *a, **k: None", "torch.testing.assert_close", True),
    "rebind a test tool": ("def check_training(*args, **kwargs):\n    return []", "check_training", True),
    "rebind by import": ("from contextlib import nullcontext as spawn", "spawn", True),
    "shadow a builtin": ("abs = lambda x: 0.0", "abs", True),
    "global builtin": ("def f():\n    global abs\n    abs = len", "global abs", True),
    "private torch": ("torch._C._set_grad_enabled(False)", "torch._C", True),
    "computed getattr": ("name = '__co' + 'de__'\ncode = getattr(len, name)", "getattr", True),
    "dunder string": ("key = '__globals__'", "'__globals__'", True),
    "unknown module": ("import my_answers", "import my_answers", True),
    "star import": ("from torch import *", "from torch import *", True),
    "file": ("open('answer.py', 'w').write('x = 1')", "open", True),
    "lab import": ("from helpers.parallel.tensor.tp import ColumnParallelLinear", "from helpers.parallel.tensor.tp import ColumnParallelLinear", False),
    "lab import as": ("import helpers.parallel.tensor.tp as tp", "import helpers.parallel.tensor.tp as tp", False),
    "lab module by attribute": ("import helpers\nlayer = helpers.parallel.tensor.tp.ColumnParallelLinear", "helpers.parallel.tensor.tp.ColumnParallelLinear", False),
    "lab module through its package": ("def f():\n    from helpers import parallel\n    return parallel.tensor.tp.RowParallelLinear", "parallel.tensor.tp.RowParallelLinear", False),
    "lab module from its family": ("from helpers.parallel.tensor import tp", "from helpers.parallel.tensor import tp", False),
    "lab module through its family": ("from helpers.parallel import tensor\nlayer = tensor.tp.ColumnParallelLinear", "tensor.tp.ColumnParallelLinear", False),
}  # fmt: skip

HONEST = {
    "same imports as the lab": "import torch\nimport torch.distributed as tdist\nfrom torch import nn",
    "a program cell": "%%program lab0_mean\nimport torch\n\nif __name__ != '__main__':\n"
    "    from lab0_shard import shard_range\n",
    "a job cell is not run by grading": "%%sbatch job --nodes 1\nimport os\nos.system('true')",
    "locals may shadow": "def f(abs, open):\n    return abs(open)",
    "methods and attributes": "class Opt:\n    def __init__(self, params):\n        super().__init__()\n"
    "        self.params = list(params)\n\n    def zero_grad(self):\n        for p in self.params:\n"
    "            p.grad = None\n        torch._foreach_zero_([p for p in self.params])",
    "display": "from IPython.display import Markdown, display\ndisplay(Markdown('**hi**'))",
    "module methods": "def count(model):\n    return len(list(model.modules()))",
}  # fmt: skip


@pytest.mark.parametrize("name", BYPASSES)
def test_each_bypass_is_refused_with_its_line_and_construct(name):
    code, construct, grader = BYPASSES[name]
    found = scan(code, POLICY)
    assert found, f"{name}: not refused"
    assert any(r.construct == construct and r.grader == grader for r in found), found
    for r in found:
        assert 1 <= r.line <= code.count("\n") + 1 and r.why, r


@pytest.mark.parametrize("name", HONEST)
def test_honest_code_runs(name):
    assert scan(HONEST[name], POLICY) == []


def test_an_ipython_shell_in_the_process_changes_nothing():
    # An IPython shell adds display and get_ipython to builtins; the guard reads the same either way.
    from IPython.core.interactiveshell import InteractiveShell

    InteractiveShell.instance()
    import builtins

    assert "display" in dir(builtins)
    assert scan(HONEST["display"], POLICY) == []


def test_a_refused_cell_names_its_line():
    code = "x = 1\ny = 2\nip = get_ipython()\n"
    (refusal,) = scan(code, POLICY)
    assert refusal.line == 3 and "line 3: get_ipython:" in str(refusal)
    (refusal,) = scan("%%program lab0_shard\n\nimport torch\nip = get_ipython()\n", POLICY)
    assert refusal.line == 4, refusal  # the line the learner sees, magic line included


@pytest.mark.parametrize("lab", labs.lab_names(ROOT))
def test_every_solution_and_wrong_answer_is_read_as_written(lab):
    """The labs' own solutions pass the guard; only wrong answers that bypass are refused."""
    solution = nbformat.read(ROOT / "solutions" / lab / f"{lab}.ipynb", as_version=4)
    released = nbformat.read(ROOT / "labs" / lab / f"{lab}.ipynb", as_version=4)
    assert (
        guard.plan(grading.fill_in(released, solution, {}), ROOT / "solutions" / lab).refused == {}
    )
    for name, cells in grading.wrong_answers(ROOT / "solutions" / lab).items():
        refused = guard.plan(grading.fill_in(released, solution, cells), ROOT / "solutions" / lab)
        expected = name.split("-", 1)[1].startswith(grading.REFUSED_PREFIXES)
        assert bool(refused.refused) == expected, (name, refused.summary())


def test_grading_toml_needs_a_reason(tmp_path):
    (tmp_path / guard.GRADING_FILE).write_text(
        '[refuse.imports]\n"torch.distributed.tensor" = ""\n'
    )
    with pytest.raises(ValueError, match="needs a reason"):
        guard.lab_imports(tmp_path)


def test_a_tag_cannot_skip_a_test_cell():
    """nbclient skips a cell tagged with its skip tag, and nbgrader counts a graded cell that
    never ran as passed: the guard removes tags from the lab's own cells before running."""
    released = nbformat.read(ROOT / "labs" / "lab0" / "lab0.ipynb", as_version=4)
    graded = [c for c in released.cells if c.metadata.get("nbgrader", {}).get("grade")]
    for cell in graded:
        cell.metadata["tags"] = [guard.DEMO_TAG, "skip-execution"]
    guard.on_notebook_start(released)
    assert all("tags" not in c.metadata for c in graded)


def test_a_refused_notebook_runs_no_test_and_says_why():
    solution = nbformat.read(ROOT / "solutions" / "lab0" / "lab0.ipynb", as_version=4)
    released = nbformat.read(ROOT / "labs" / "lab0" / "lab0.ipynb", as_version=4)
    cells = grading.wrong_answers(ROOT / "solutions" / "lab0")["wrong-tamper_ast_transformer"]
    nb = grading.fill_in(released, solution, cells)
    plan = guard.plan(nb, ROOT / "labs" / "lab0")
    for i, cell in enumerate(nb.cells):
        code = plan.replacement(i, cell)
        if cell.metadata.get("nbgrader", {}).get("grade"):
            assert "SubmissionRefused" in code and "cell 'shard_range' line 12:" in code
        elif cell.cell_type == "code":
            assert code is not None and "SubmissionRefused" not in code  # skipped: nothing runs
