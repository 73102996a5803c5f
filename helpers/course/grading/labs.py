"""Labs: release student versions from solutions, and check that grading works.

A lab is a folder ``solutions/<lab>/`` holding one or more notebooks with
nbgrader cell metadata (``<lab>/<lab>.ipynb`` by convention). Everything here
is found by listing ``solutions/``, so a new lab needs no registration::

    python -m helpers.course.grading.labs release            # regenerate labs/ from solutions/
    python -m helpers.course.grading.labs check              # exit 1 if labs/ is out of date
    python -m helpers.course.grading.labs roundtrip lab0     # autograde three fake students, print scores

``release`` runs ``nbgrader generate_assignment`` in a scratch course directory
(with the checkout's ``nbgrader_config.py``), normalises the notebooks so the
output is byte-for-byte deterministic, and replaces ``labs/<lab>/``.

Grading (fake students, wrong answers, autograde) is helpers.course.grading.roundtrip.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

from helpers.course.grading.course_dir import (
    KERNEL_WRITES,
    _root,
    generate_all,
    lab_names,
    make_course,
    notebooks,
)

__all__ = [
    "lab_names",
    "labs_with_jobs",
    "notebooks",
    "out_of_sync",
    "release",
    "sbatch_cells",
    "stale_labs",
]

_SBATCH_CELL = re.compile(r"^%%sbatch\s+(\S+)(.*)$", re.M)


def sbatch_cells(nb) -> list[tuple[str, str, str]]:
    """(job name, magic line arguments, cell source) of each ``%%sbatch`` cell of ``nb``.

    nb: a notebook node or the path of one.
    """
    if not hasattr(nb, "cells"):
        import nbformat

        nb = nbformat.read(nb, as_version=4)
    found = []
    for cell in nb.cells:
        m = _SBATCH_CELL.match(cell.source) if cell.cell_type == "code" else None
        if m:
            found.append((m.group(1), m.group(2), cell.source))
    return found


def labs_with_jobs(root: Path | None = None) -> list[Path]:
    """The lab solution notebooks that submit a Slurm job (have a ``%%sbatch`` cell)."""
    top = _root(root) / "solutions"
    return [p for p in sorted(top.glob("lab*/lab*.ipynb")) if sbatch_cells(p)]


# --------------------------------------------------------------------------- release


def release(root: Path | None = None, dest: Path | None = None) -> list[Path]:
    """Regenerate ``dest`` (default labs/) from solutions/; returns the lab folders written."""
    top = _root(root)
    dest = Path(dest) if dest else top / "labs"
    written = []
    with tempfile.TemporaryDirectory(prefix="labs-release-") as tmp:
        course = make_course(Path(tmp), top)
        for built in generate_all(course):
            target = dest / built.name
            if target.exists():
                shutil.rmtree(target)  # files removed from solutions/ disappear too
            shutil.copytree(built, target)
            written.append(target)
    return written


def compare(fresh: Path, committed: Path, lab: str) -> list[str]:
    """Files of one lab that differ between a fresh release and the committed labs/."""

    def files(top: Path) -> dict:
        found = ((p.relative_to(top), p) for p in (Path(top) / lab).rglob("*") if p.is_file())
        return {rel: p for rel, p in found if not set(rel.parts) & set(KERNEL_WRITES)}

    want, have = files(fresh), files(committed)
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


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m helpers.course.grading.labs", description=__doc__.split("\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("release", help="regenerate labs/ from solutions/")
    sub.add_parser("check", help="exit 1 if labs/ differs from a fresh release")
    rt = sub.add_parser("roundtrip", help="autograde release/solution/wrong answers of a lab")
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
            print("labs/ is out of date: run `python -m helpers.course.grading.labs release`")
        return 1 if problems else 0
    from helpers.course.grading.roundtrip import roundtrip

    labs = [args.lab] if args.lab else lab_names()
    for lab in labs:
        if lab not in lab_names():
            ap.error(f"no lab {lab!r} in solutions/; labs: {', '.join(lab_names())}")
        with tempfile.TemporaryDirectory(prefix=f"roundtrip-{lab}-") as tmp:
            for student, (score, max_score) in sorted(roundtrip(lab, Path(tmp)).items()):
                print(f"{lab:12s} {student:28s} {score:6.1f} / {max_score:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
