"""``python -m helpers.course.bench grading``: seconds per submission when autograding a class.

For each lab, a scratch course gets N submissions (the lab's fake students in
turn: solution, untouched release, each wrong answer), and one ``nbgrader
autograde`` call grades them all, as an instructor would. Then the parts of one
submission's cost are measured in fresh processes: starting Python with torch,
and the first ``launch.spawn`` (the warm pool's start) against a later one.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from helpers.config import parse
from helpers.course.grading import roundtrip as grading
from helpers.course.grading.course_dir import generate, lab_names, make_course, notebooks

PARTS = """
import time
t0 = time.perf_counter()
import torch
from helpers import launch
t1 = time.perf_counter()
launch.spawn(lambda d: d.rank, world_size=4)
t2 = time.perf_counter()
launch.spawn(lambda d: d.rank, world_size=4)
t3 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2)
"""


@dataclass
class Options:
    n: int = 30  # submissions per lab (a workshop class)
    labs: str = ""  # comma-separated; empty: every lab
    # Also grade each class with the labs' `launch.warm_up(wait=False)` line removed:
    # the "before" figure of that optimisation, on the same submissions.
    compare: bool = False
    # Also grade each class the way grading worked before the sandbox: every notebook run
    # top to bottom in a kernel, the tests in the same process as the learner's code.
    kernel: bool = False


def _without_warm_up(nb):
    """The notebook with its `launch.warm_up(...)` lines removed (the pool starts on first use)."""
    for cell in nb.cells:
        if cell.cell_type == "code" and "launch.warm_up(" in cell.source:
            lines = cell.source.splitlines()
            cell.source = "\n".join(x for x in lines if "launch.warm_up(" not in x)
    return nb


def _class_of(course: Path, lab: str, n: int, warm_up: bool = True) -> None:
    """submitted/s00 ... s<n-1>/<lab>/: the fake students of the lab, in turn."""
    for src in notebooks(course / "solutions" / lab):
        released = nbformat.read(course / "labs" / lab / src.name, as_version=4)
        solution = nbformat.read(src, as_version=4)
        kinds = {"release": released, "solution": grading.fill_in(released, solution, {})}
        for name, cells in grading.wrong_answers(course / "solutions" / lab).items():
            kinds[name] = grading.fill_in(released, solution, cells)
        for i, nb in zip(range(n), itertools.cycle(kinds.values())):
            path = course / "submitted" / f"s{i:02d}" / lab / src.name
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb if warm_up else _without_warm_up(nb), path)


KERNEL_GRADING = """
# The bench's "before": grading in a kernel, as before the sandbox (the guard on Execute).
from helpers.course.grading import guard as _guard
from nbgrader.converters.autograde import Autograde as _Autograde
from nbgrader.validator import Validator as _Validator

c.Autograde.autograde_preprocessors = list(_Autograde.class_traits()["autograde_preprocessors"].default())
c.Validator.preprocessors = list(_Validator.class_traits()["preprocessors"].default())
_guard.configure(c)
"""


def time_lab(lab: str, n: int, warm_up: bool = True, kernel: bool = False) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        course = make_course(Path(tmp))
        if kernel:
            with (course / "nbgrader_config.py").open("a") as f:
                f.write(KERNEL_GRADING)
        generate(course, lab)
        _class_of(course, lab, n, warm_up)
        t0 = time.perf_counter()
        scores = grading.autograde(course, lab, check=False)
        seconds = time.perf_counter() - t0
    if len(scores) != n:
        print(f"  warning: {lab}: {n - len(scores)} submission(s) were not graded")
    return seconds


def main(argv: list[str] | None = None) -> None:
    opts = parse(Options, argv)
    labs = [x for x in opts.labs.split(",") if x] or lab_names()
    print(f"autograding {opts.n} submissions per lab (one nbgrader autograde call each)")
    print(f"{'lab':<8}{'grader':<10}{'warm-up line':<14}{'total s':>10}{'s/submission':>14}")
    for lab in labs:
        for kernel in (False, True) if opts.kernel else (False,):
            for warm_up in (True, False) if opts.compare else (True,):
                seconds = time_lab(lab, opts.n, warm_up, kernel)
                kept = "kept" if warm_up else "removed"
                where = "kernel" if kernel else "sandbox"
                print(
                    f"{lab:<8}{where:<10}{kept:<14}{seconds:>10.1f}{seconds / opts.n:>14.2f}",
                    flush=True,
                )
    out = subprocess.run([sys.executable, "-c", PARTS], capture_output=True, text=True, check=True)
    imports, first, later = (float(x) for x in out.stdout.split()[-3:])
    print("\nwhere one submission's time goes (fresh process, 4 ranks):")
    print(f"  import torch + helpers   {imports:6.2f} s")
    print(
        f"  first launch.spawn       {first:6.2f} s  (starts the warm pool: the zygote imports torch)"
    )
    print(f"  a later launch.spawn     {later:6.2f} s")
    print(
        "measured on this machine's CPU cores; on a GPU node the labs' tests still run on CPU (gloo)."
    )
