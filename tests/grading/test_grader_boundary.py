"""What learner code cannot do to its grade, lab by lab, with the guard switched off.

The guard reads cells first and refuses what reaches for the grader; these tests switch
it off (``grade(..., guard_first=False)``) so that they show the boundary itself: the
tests and the verdict in the grader's process, the learner's code in bubblewrap
sandboxes, the ranks' messages through the grader.

For each lab, one submission written for the purpose (tests/grading/attack_cell.py in its
first solution cell, every answer left a stub) tries to patch the checks, install hooks,
walk frames and live objects for the tests' reference functions, read the course's
solutions and gradebook, write the course, the notebook's directory and a shared /tmp,
leave a process running (double fork, new session), open a socket to another rank, and
signal the grader, load the modules the lab refuses by every route (torch.importlib,
sys.modules, __import__, the file by path, its source, its .pyc), reach the lab's reference
functions, and read the grader's environment, the course and other users' homes. It must
score zero, every attempt must have failed in the sandbox, no file of the course may
change, and no process of it may be left once grading ends. (A refused module that torch's
own start-up or the slot's preload loaded, such as torch.nn.parallel or
torch.distributed.tensor, is taken out of the job's sys.modules before any learner code:
the report's "loaded" must be empty and every route is checked.)

With the guard on, as in a class: a parameters cell that patches the grader is refused and
the notebook graded as if it held the instructor's values (stubs: zero; solution: full).
(A message the recorder does not see: tests/distributed/test_relay.py sends collectives with
the rank's recorder bypassed and finds each in the switch's log; tests/distributed/
test_sandbox.py tries each side channel between two ranks.)
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from helpers.course.grading import labs
from helpers.course.grading import roundtrip as grading
from helpers.course.grading.grader.cells import _defined_names
from helpers.course.grading.grader.lab import lab_of
from helpers.course.grading.grader.magics import python_of
from helpers.course.grading.grader.preprocessor import shared_pool
from helpers.course.grading.grader.run import grade
from helpers.course.grading.lab_policy import nbgrader_meta
from helpers.course.grading.sandbox.absent import module_files

ROOT = Path(__file__).resolve().parents[2]
ATTACK = (Path(__file__).parent / "attack_cell.py").read_text()
LABS = labs.lab_names(ROOT)

pytestmark = pytest.mark.slow


def _course(tmp_path: Path, lab: str) -> Path:
    """A course directory with the secrets the attack looks for."""
    course = tmp_path / "course"
    shutil.copytree(ROOT / "solutions" / lab, course / "solutions" / lab)
    (course / "gradebook.db").write_bytes(b"SQLite format 3\x00 the instructor's grades")
    (course / "autograded" / "someone" / lab).mkdir(parents=True)
    (course / "submitted" / "someone" / lab).mkdir(parents=True)
    (course / "nbgrader_config.py").write_text("c = get_config()\n")
    return course


def _fingerprint(course: Path) -> dict[str, str]:
    return {
        str(p.relative_to(course)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(course.rglob("*"))
        if p.is_file()
    }


def _public_names(lab: str) -> set[str]:
    """Names with "reference" in them that the released lab (what learners have) uses."""
    released = (ROOT / "labs" / lab / f"{lab}.ipynb").read_text()
    return set(re.findall(r"\w*reference\w*", released))


def _scores(nb, outputs) -> tuple[int, int]:
    got = total = 0
    for i, cell in enumerate(nb.cells):
        meta = nbgrader_meta(cell)
        if meta.get("grade") and not meta.get("solution"):
            total += meta["points"]
            failed = any(o.get("output_type") == "error" for o in outputs.get(i, []))
            got += 0 if failed else meta["points"]
    return got, total


# The lab's own reference functions: what decides a test, never to be within the learner's
# reach. Each is defined by a cell its grading.toml keeps in the grader, or imported by the
# lab from a module it refuses (checked below, so the list cannot go stale).
REFERENCES = {
    "lab3": ["simulate"],
    "lab6": ["reverse_buckets"],
    "lab7": ["serial_attention", "serial_rows"],
    "lab8": ["gates", "as_gates", "serial_moe"],
}


def _references(lab: str) -> list[str]:
    """REFERENCES[lab], each checked to be grader-only or imported from a refused module."""
    policy = lab_of(ROOT / "solutions" / lab)
    nb = nbformat.read(ROOT / "solutions" / lab / f"{lab}.ipynb", as_version=4)
    kept_away = set()
    for cell in nb.cells:
        if cell.cell_type != "code" or not nbgrader_meta(cell).get("grade_id"):
            continue
        if nbgrader_meta(cell)["grade_id"] in policy.grader_only:
            kept_away |= _defined_names(cell.source)
        for node in ast.walk(ast.parse(python_of(cell.source)[2])):
            if isinstance(node, ast.ImportFrom) and any(
                (node.module or "").startswith(m) for m in policy.refused
            ):
                kept_away |= {a.asname or a.name for a in node.names}
    names = REFERENCES.get(lab, [])
    assert set(names) <= kept_away, f"{lab}: {set(names) - kept_away} reach the sandbox"
    return names


def _refused_files(lab: str) -> dict[str, list[str]]:
    files: dict[str, list[str]] = {}
    for module, path in module_files(lab_of(ROOT / "solutions" / lab).refused):
        files.setdefault(module, []).append(path)
    return files


def _attack_submission(lab: str, course: Path):
    """The released lab (stubs) with the attack in its first solution cell."""
    nb = nbformat.read(ROOT / "labs" / lab / f"{lab}.ipynb", as_version=4)
    first = next(c for c in nb.cells if nbgrader_meta(c).get("solution") and c.cell_type == "code")
    attack = (
        ATTACK.replace("ROOT", repr(str(course)))
        .replace("CHECKOUT", repr(str(ROOT)))
        .replace("GRADER_PID", str(os.getpid()))
        .replace("REFUSED", repr(_refused_files(lab)))
        .replace("REFERENCES", repr(_references(lab)))
    )
    head, sep, body = first.source.partition("\n")
    first.source = (
        f"{head}{sep}{attack}\n{body}" if head.startswith("%%") else f"{attack}\n{first.source}"
    )
    return nb


def _slot_python(proc) -> bool:
    argv = proc.cmdline()
    return bool(argv) and "python" in Path(argv[0]).name and "sandbox.slot" in " ".join(argv)


def _leftovers(pool) -> list[str]:
    """Processes in the pool's sandboxes beyond each slot's python and its one spare rank
    (forked ahead of the next job): what a job left running."""
    time.sleep(0.5)
    out = []
    for pid in pool.pids():
        try:
            proc = psutil.Process(pid)
            if _slot_python(proc) and not _slot_python(proc.parent()):
                kids = proc.children(recursive=True)
                if len(kids) > 1:
                    out += [f"{k.pid}: {' '.join(k.cmdline())[:80]}" for k in kids]
        except psutil.Error:
            continue
    return out


@pytest.mark.parametrize("lab", LABS)
def test_a_submission_that_tries_every_way_out_scores_zero_and_changes_nothing(lab, tmp_path):
    course = _course(tmp_path, lab)
    nb = _attack_submission(lab, course)
    pool = shared_pool()
    pool.call(
        "__workbook_cell_errors__",
        learner_source="def __workbook_cell_errors__():\n    return []\n",
        programs={},
    )  # slots up before the count
    prints = _fingerprint(course)
    outputs = grade(nb, course / "solutions" / lab, pool, guard_first=False)
    got, total = _scores(nb, outputs)
    assert total > 0 and got == 0, f"{lab}: the attack scored {got}/{total}"
    reports = [
        json.loads(o["evalue"].split("ATTACK REPORT ", 1)[1])
        for outs in outputs.values()
        for o in outs
        if o.get("output_type") == "error" and "ATTACK REPORT " in o.get("evalue", "")
    ]
    assert reports, f"{lab}: the attack cell's report did not come back"
    loaded = reports[0].pop("loaded")
    assert loaded == [], f"{lab}: {loaded} in the sandbox's sys.modules"
    for name, got_back in reports[0].items():
        if name in ("write /tmp", "write cwd"):
            continue  # the sandbox's private /tmp and scratch: writable, and gone after the job
        if name in ("frames", "objects"):  # only what the released lab itself names may be found
            found = set(ast.literal_eval(got_back[4:])) if got_back.startswith("ok: ") else set()
            assert found <= _public_names(lab), (
                f"{lab}: {name} reached {found - _public_names(lab)}"
            )
            continue
        if name == "linger":
            continue  # the fork itself works; what matters is that nothing is left: below
        assert not got_back.startswith("ok"), f"{lab}: {name} succeeded in the sandbox: {got_back}"
    assert _fingerprint(course) == prints, f"{lab}: the course directory changed"
    assert not Path("/tmp/pwned.txt").exists(), "a sandbox wrote the grader's /tmp"
    pool.end_learner()
    assert _leftovers(pool) == [], f"{lab}: processes outlived the grading"


# A parameters cell that patches the grader's cell runner from a class body (the guard lets a
# class's own names be assigned): on 7718dfa its definitions ran in the grader and every test
# passed with stub answers. Now the cell is data: refused, and graded as the instructor's.
PATCHING_PARAMETERS = """SMOKE = False
import torch


class Patch:
    run = torch.importlib.import_module("helpers.course.grading.grader.run")
    run._run_cell = lambda code, name, ns: ("", None)
    run.split = lambda *args, **kwargs: None
"""


def _with_parameters(nb, source: str):
    (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    cell.source = source
    return nb.cells.index(cell)


def _graded_with_patching_parameters(nb, lab: str):
    from helpers.course.grading.grader import run

    index = _with_parameters(nb, PATCHING_PARAMETERS)
    saved = run._run_cell, run.split
    pool = shared_pool()
    try:
        outputs = grade(nb, ROOT / "solutions" / lab, pool)
    finally:
        run._run_cell, run.split = saved  # whatever happened, the next test gets the grader
        pool.end_learner()
    (refused,) = outputs.get(index, [{}])
    assert refused.get("ename") == "ParametersRefused", outputs.get(index)
    assert (
        "a parameters cell holds only assignments of literal values to SMOKE" in refused["evalue"]
    )
    return _scores(nb, outputs)


@pytest.mark.parametrize("lab", LABS)
def test_a_parameters_cell_that_patches_the_grader_is_refused(lab):
    nb = nbformat.read(ROOT / "labs" / lab / f"{lab}.ipynb", as_version=4)  # stub answers
    got, total = _graded_with_patching_parameters(nb, lab)
    assert total > 0 and got == 0, f"{lab}: stubs with a patching parameters cell scored {got}"


@pytest.mark.parametrize("lab", ["lab0", "lab5"])
def test_the_rest_is_graded_as_with_the_instructors_parameters(lab):
    released = nbformat.read(ROOT / "labs" / lab / f"{lab}.ipynb", as_version=4)
    solution = nbformat.read(ROOT / "solutions" / lab / f"{lab}.ipynb", as_version=4)
    got, total = _graded_with_patching_parameters(grading.fill_in(released, solution, {}), lab)
    assert got == total, f"{lab}: the solution scored {got}/{total} beside a refused cell"
