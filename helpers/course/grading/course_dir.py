"""An nbgrader course in a scratch directory: the pieces release and grading share.

``make_course`` copies the checkout's nbgrader_config.py and solutions/ into a
directory; ``generate`` runs ``nbgrader generate_assignment`` there and
normalises the released notebooks so a release is byte-for-byte reproducible.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

from helpers.runs import workbook_root

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
def venv_on_path():
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


def nbgrader(args: list[str], cwd: Path, timeout: float = 1800, check: bool = True) -> str:
    """Run an nbgrader command in ``cwd``; return its output, raise with it on failure.

    ``check=False`` returns the output of a failed run too: ``autograde`` exits 1
    when one submission could not be graded, after grading all the others.
    """
    cmd = [sys.executable, "-m", "nbgrader", *args]
    with venv_on_path():
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0 and check:
        raise RuntimeError(f"`nbgrader {' '.join(args)}` failed in {cwd}:\n{out}")
    return out


# Folders a kernel writes next to a lab when it runs (never part of a release).
KERNEL_WRITES = (
    "programs",
    "__pycache__",
    ".ipynb_checkpoints",
    "kernel-ipc-*",
)  # ipc: a kernel's sockets


def make_course(dest: Path, root: Path | None = None) -> Path:
    """A scratch nbgrader course: the checkout's config and a copy of solutions/."""
    top = _root(root)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(top / "nbgrader_config.py", dest / "nbgrader_config.py")
    # programs/ holds what %%program cells wrote when the instructor ran a solution:
    # solution code, which must never reach a student release.
    ignore = shutil.ignore_patterns(*KERNEL_WRITES)
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


def generate_all(course: Path) -> list[Path]:
    """``generate`` for every lab of the course in one nbgrader call (``"*"``: each nbgrader
    command spends ~3 s starting up); returns the releases."""
    nbgrader(["generate_assignment", "*", "--force"], cwd=course)
    out = sorted(p for p in (Path(course) / "labs").iterdir() if p.is_dir())
    for lab in out:
        for nb in notebooks(lab):
            normalize(nb)
    return out


def generate(course: Path, lab: str) -> Path:
    """``nbgrader generate_assignment`` for one lab inside a scratch course; returns its release."""
    nbgrader(["generate_assignment", lab, "--force"], cwd=course)
    out = Path(course) / "labs" / lab
    for nb in notebooks(out):
        normalize(nb)
    return out
