"""Labs: release student versions from solutions, and check that grading works.

A lab is a folder ``solutions/<lab>/`` holding one or more notebooks with
nbgrader cell metadata (``<lab>/<lab>.ipynb`` by convention). Everything here
is found by listing ``solutions/``, so a new lab needs no registration::

    python -m helpers.course.labs release            # regenerate labs/ from solutions/
    python -m helpers.course.labs check              # exit 1 if labs/ is out of date
    python -m helpers.course.labs roundtrip lab0     # autograde three fake students, print scores

``release`` runs ``nbgrader generate_assignment`` in a scratch course directory
(with the checkout's ``nbgrader_config.py``), normalises the notebooks so the
output is byte-for-byte deterministic, and replaces ``labs/<lab>/``.

The wrong-answer file
---------------------
The grading tests submit three fake students per lab: the untouched release
(must score 0), the solution (full marks) and a plausible wrong answer (strictly
in between). The wrong answer lives next to the solution in
``solutions/<lab>/wrong_answers.py`` (never released: nbgrader_config.py ignores
it). It is plain Python split into cells by header lines::

    # %% cell: mean_on_ranks
    def mean_on_ranks(d, data):
        ...                       # the whole replacement source of that cell

Each ``cell:`` names the ``grade_id`` of a solution cell; the text up to the
next header replaces that cell's source. Solution cells not named keep the
solution. Lines before the first header are comments for the reader.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

from helpers.runs import workbook_root

WRONG_ANSWERS = "wrong_answers.py"
STUDENTS = ("release", "solution", "wrong")  # fake students of the grading round trip
_CELL_HEADER = re.compile(r"^# %% cell: *(\S+) *$", re.MULTILINE)
_SOLUTION_MARKER = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n?", re.MULTILINE)
# Cell metadata that editors add and that says nothing about the lab.
_TRANSIENT_CELL_KEYS = ("execution", "ExecuteTime", "collapsed", "scrolled", "papermill")
_KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def _root(root: Path | None) -> Path:
    top = root or workbook_root()
    if top is None:
        raise FileNotFoundError("not inside the workbook checkout: pass root= or cd into it")
    return Path(top)


def lab_names(root: Path | None = None) -> list[str]:
    """Every folder of solutions/ that holds a notebook, sorted."""
    src = _root(root) / "solutions"
    return sorted(p.name for p in src.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))


def notebooks(lab_dir: Path) -> list[Path]:
    return sorted(Path(lab_dir).glob("*.ipynb"))


@contextlib.contextmanager
def _venv_on_path():
    """Put this interpreter's bin/ first on PATH for a while.

    nbgrader's Gradebook shells out to ``alembic``, installed next to the
    interpreter; a venv used without ``activate`` would not find it.
    """
    old = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), old])
    try:
        yield
    finally:
        os.environ["PATH"] = old


def nbgrader(args: list[str], cwd: Path, timeout: float = 1800) -> str:
    """Run an nbgrader command in ``cwd``; return its output, raise with it on failure."""
    cmd = [sys.executable, "-m", "nbgrader", *args]
    with _venv_on_path():
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"`nbgrader {' '.join(args)}` failed in {cwd}:\n{out}")
    return out


# --------------------------------------------------------------------------- release


def make_course(dest: Path, root: Path | None = None) -> Path:
    """A scratch nbgrader course: the checkout's config and a copy of solutions/."""
    top = _root(root)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(top / "nbgrader_config.py", dest / "nbgrader_config.py")
    ignore = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
    shutil.copytree(top / "solutions", dest / "solutions", ignore=ignore, dirs_exist_ok=True)
    return dest


def normalize(path: Path) -> None:
    """Rewrite a notebook without outputs, counts or editor state, in nbformat's layout."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        for key in _TRANSIENT_CELL_KEYS:
            cell.metadata.pop(key, None)
    # Machine-specific bits (python version, display names) vary between laptops.
    nb.metadata = {
        **{k: v for k, v in nb.metadata.items() if k in ("nbgrader", "celltoolbar")},
        "kernelspec": dict(_KERNELSPEC),
        "language_info": {"name": "python"},
    }
    nbformat.write(nb, path)


def generate(course: Path, lab: str) -> Path:
    """``nbgrader generate_assignment`` for one lab inside a scratch course; returns its release."""
    nbgrader(["generate_assignment", lab, "--force"], cwd=course)
    out = Path(course) / "labs" / lab
    for nb in notebooks(out):
        normalize(nb)
    return out


def release(root: Path | None = None, dest: Path | None = None) -> list[Path]:
    """Regenerate ``dest`` (default labs/) from solutions/; returns the lab folders written."""
    top = _root(root)
    dest = Path(dest) if dest else top / "labs"
    written = []
    with tempfile.TemporaryDirectory(prefix="labs-release-") as tmp:
        course = make_course(Path(tmp), top)
        for lab in lab_names(top):
            built = generate(course, lab)
            target = dest / lab
            if target.exists():
                shutil.rmtree(target)  # files removed from solutions/ disappear too
            shutil.copytree(built, target)
            written.append(target)
    return written


def compare(fresh: Path, committed: Path, lab: str) -> list[str]:
    """Files of one lab that differ between a fresh release and the committed labs/."""
    want = {p.relative_to(fresh): p for p in (Path(fresh) / lab).rglob("*") if p.is_file()}
    have = {p.relative_to(committed): p for p in (Path(committed) / lab).rglob("*") if p.is_file()}
    problems = []
    for rel in sorted(set(want) | set(have)):
        if rel not in have:
            problems.append(f"labs/{rel} is missing")
        elif rel not in want:
            problems.append(f"labs/{rel} is not produced by the release")
        elif want[rel].read_bytes() != have[rel].read_bytes():
            problems.append(f"labs/{rel} differs from a fresh release")
    return problems


def stale_labs(root: Path | None = None) -> list[str]:
    """Folders of labs/ without a solution (a renamed or deleted lab)."""
    top = _root(root)
    labs_dir = top / "labs"
    released = {p.name for p in labs_dir.iterdir() if p.is_dir()} if labs_dir.is_dir() else set()
    return sorted(released - set(lab_names(top)))


def out_of_sync(root: Path | None = None) -> list[str]:
    """What differs between labs/ and a fresh release (empty when in sync)."""
    top = _root(root)
    problems = [
        f"labs/{name}/ has no solutions/{name}/: delete it or add the solution"
        for name in stale_labs(top)
    ]
    with tempfile.TemporaryDirectory(prefix="labs-check-") as tmp:
        fresh = Path(tmp) / "labs"
        release(top, fresh)
        for lab in lab_names(top):
            problems += compare(fresh, top / "labs", lab)
    return problems


# --------------------------------------------------------------------------- grading round trip


def wrong_answers(lab_dir: Path) -> dict[str, str]:
    """The cell replacements of ``<lab_dir>/wrong_answers.py`` (format in the module docstring)."""
    path = Path(lab_dir) / WRONG_ANSWERS
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: add a plausible wrong answer for this lab "
            "(format: see the docstring of helpers/labs.py)"
        )
    parts = _CELL_HEADER.split(path.read_text())
    if len(parts) < 3:
        raise ValueError(f"{path} has no '# %% cell: <grade_id>' header line")
    # parts = [preamble, id1, body1, id2, body2, ...]
    return {cid: body.strip("\n") for cid, body in zip(parts[1::2], parts[2::2], strict=True)}


def solution_source(source: str) -> str:
    """A solution cell as a learner who found the answer would type it (markers removed)."""
    return _SOLUTION_MARKER.sub("", source).rstrip("\n")


def fill_in(
    released: nbformat.NotebookNode, solution: nbformat.NotebookNode, replacements: dict[str, str]
) -> nbformat.NotebookNode:
    """The released notebook with every solution cell answered: from ``replacements``
    when it names the cell's grade_id, otherwise with the solution."""
    answers = {
        c.metadata["nbgrader"]["grade_id"]: solution_source(c.source)
        for c in solution.cells
        if c.metadata.get("nbgrader", {}).get("solution")
    }
    out = nbformat.from_dict(released)
    for cell in out.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            cell.source = replacements.get(meta["grade_id"], answers[meta["grade_id"]])
    return out


def submit_fake_students(course: Path, lab: str) -> None:
    """Write submitted/{release,solution,wrong}/<lab>/ into a course with a generated release."""
    course = Path(course)
    wrong = wrong_answers(course / "solutions" / lab)
    used: set[str] = set()
    for src in notebooks(course / "solutions" / lab):
        released = nbformat.read(course / "labs" / lab / src.name, as_version=4)
        solution = nbformat.read(src, as_version=4)
        meta = [c.metadata.get("nbgrader", {}) for c in released.cells]
        used |= {m["grade_id"] for m in meta if m.get("solution")} & set(wrong)
        versions = {
            "release": released,
            "solution": fill_in(released, solution, {}),
            "wrong": fill_in(released, solution, wrong),
        }
        for student, nb in versions.items():
            path = course / "submitted" / student / lab / src.name
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, path)
    if unknown := set(wrong) - used:
        raise ValueError(
            f"solutions/{lab}/{WRONG_ANSWERS} names cells {sorted(unknown)} that are not "
            f"solution cells of {lab}: use the grade_id of a cell with '### BEGIN SOLUTION'"
        )


def autograde(course: Path, lab: str) -> dict[str, tuple[float, float]]:
    """Autograde every submission of ``lab`` in one nbgrader call; (score, max) per student."""
    from nbgrader.api import Gradebook

    nbgrader(["autograde", lab, "--force"], cwd=course)
    db = f"sqlite:///{Path(course).resolve() / 'gradebook.db'}"
    with _venv_on_path(), Gradebook(db) as gb:
        scores = {}
        for sub in gb.assignment_submissions(lab):
            scores[sub.student.id] = (sub.score, sub.max_score)
    return scores


def roundtrip(lab: str, workdir: Path, root: Path | None = None) -> dict[str, tuple[float, float]]:
    """Release, submit the three fake students and autograde them, in ``workdir``."""
    course = make_course(Path(workdir), root)
    generate(course, lab)
    submit_fake_students(course, lab)
    return autograde(course, lab)


def validate(notebook: Path, invert: bool = False) -> tuple[bool, str]:
    """``nbgrader validate [--invert]``: (passed, output). nbgrader exits 0 either way."""
    nb = Path(notebook).resolve()
    args = ["validate", *(["--invert"] if invert else []), str(nb)]
    # Run from the checkout so its nbgrader_config.py (cell timeout) applies.
    out = nbgrader(args, cwd=workbook_root(nb.parent) or nb.parent)
    ok = "Success!" in out and "FAILED" not in out and "NOTEBOOK PASSED" not in out
    return ok, out


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m helpers.course.labs", description=__doc__.split("\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("release", help="regenerate labs/ from solutions/")
    sub.add_parser("check", help="exit 1 if labs/ differs from a fresh release")
    rt = sub.add_parser("roundtrip", help="autograde release/solution/wrong answer of a lab")
    rt.add_argument("lab", nargs="?", help="one lab (default: every lab)")
    args = ap.parse_args(argv)

    if args.cmd == "release":
        for path in release():
            print(f"released {path.relative_to(_root(None))}/")
        return 0
    if args.cmd == "check":
        problems = out_of_sync()
        for p in problems:
            print(p)
        if problems:
            print("labs/ is out of date: run `python -m helpers.course.labs release`")
        return 1 if problems else 0
    labs = [args.lab] if args.lab else lab_names()
    for lab in labs:
        if lab not in lab_names():
            ap.error(f"no lab {lab!r} in solutions/; labs: {', '.join(lab_names())}")
        with tempfile.TemporaryDirectory(prefix=f"roundtrip-{lab}-") as tmp:
            for student, (score, max_score) in sorted(roundtrip(lab, Path(tmp)).items()):
                print(f"{lab:12s} {student:10s} {score:6.1f} / {max_score:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
