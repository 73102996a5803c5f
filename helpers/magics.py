"""Notebook cell magics: ``%load_ext helpers`` registers them.

%%torchrun -n 4 NAME [--timeout S] [--threads T] [--out VAR] [-- prog args]
    Writes the cell to ``programs/NAME.py`` (relative to the notebook's
    directory) and starts it with helpers.launch.run() on 4 local ranks. The
    file is an ordinary program: ``python programs/NAME.py`` (one process) and
    ``torchrun --nproc-per-node 4 programs/NAME.py`` start it by hand too.
    The RunResult is the cell's value (so ``_`` holds it), is stored as
    ``_torchrun`` in the notebook and, with ``--out VAR``, as ``VAR``.
    A failing run raises RankFailure, so papermill and "Run all" stop there.

%%sbatch ...
    Submits the cell as a Slurm job; see helpers.slurm.sbatch_magic.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from helpers import launch, runs

PROGRAMS_DIR = "programs"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # raise instead of exiting the kernel
        raise ValueError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="%%torchrun",
        description="Write the cell to programs/NAME.py and torchrun it on local ranks.",
    )
    p.add_argument("-n", "--nproc", type=int, default=4, help="number of ranks (default 4)")
    p.add_argument("name", help="program and run name: programs/NAME.py, runs/NAME/<id>/")
    p.add_argument(
        "--timeout", type=float, default=600, help="seconds before every rank is stopped"
    )
    p.add_argument("--threads", type=int, default=None, help="threads per rank (default: cores/N)")
    p.add_argument("--out", default=None, help="also store the RunResult in this variable")
    return p


def parse_line(line: str) -> tuple[argparse.Namespace, list[str]]:
    """Split '%%torchrun -n 2 hello -- --epochs 3' into options and program args."""
    words = shlex.split(line)
    prog_args: list[str] = []
    if "--" in words:
        i = words.index("--")
        words, prog_args = words[:i], words[i + 1 :]
    try:
        opts = _parser().parse_args(words)
    except ValueError as e:
        raise ValueError(
            f"could not read '%%torchrun {line}': {e}. "
            "Usage: %%torchrun -n 4 NAME [--timeout S] [--threads T] [--out VAR] [-- program args]"
        ) from None
    runs.check_name(opts.name)
    if opts.out is not None and not opts.out.isidentifier():
        raise ValueError(f"--out needs a Python variable name, got {opts.out!r}")
    return opts, prog_args


def write_program(name: str, cell: str, directory: str | Path = PROGRAMS_DIR) -> Path:
    """Save a cell as programs/NAME.py (overwriting the previous version of the cell)."""
    path = Path(directory) / f"{runs.check_name(name)}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cell if cell.endswith("\n") else cell + "\n")
    return path


def torchrun_magic(line: str, cell: str, user_ns: dict | None = None) -> launch.RunResult:
    """The function behind %%torchrun (callable without IPython, e.g. from tests)."""
    opts, prog_args = parse_line(line)
    path = write_program(opts.name, cell)
    result = launch.run(
        path,
        nproc=opts.nproc,
        name=opts.name,
        args=prog_args,
        timeout=opts.timeout,
        threads=opts.threads,
    )
    if user_ns is not None:
        user_ns["_torchrun"] = result
        if opts.out:
            user_ns[opts.out] = result
    # Raising makes "Run all" and papermill stop at the failing cell; every earlier
    # run stays in runs/NAME/ and the message names the rank.
    return result.raise_for_status()


def sbatch_magic(line: str, cell: str, ipython=None):
    """%%sbatch: delegated to helpers.slurm, imported only when used."""
    try:
        from helpers import slurm
    except ImportError as e:
        raise RuntimeError(f"%%sbatch needs helpers.slurm, which could not be imported: {e}") from e
    fn = getattr(slurm, "sbatch_magic", None)
    if fn is None:
        raise RuntimeError(
            "%%sbatch needs helpers.slurm.sbatch_magic(line, cell, ipython), not found"
        )
    return fn(line, cell, ipython)


def register(ipython) -> None:
    """Register %%torchrun and %%sbatch with an IPython shell."""

    def torchrun(line, cell):
        return torchrun_magic(line, cell, ipython.user_ns)

    def sbatch(line, cell):
        return sbatch_magic(line, cell, ipython)

    torchrun.__doc__ = __doc__
    sbatch.__doc__ = sbatch_magic.__doc__
    ipython.register_magic_function(torchrun, magic_kind="cell", magic_name="torchrun")
    ipython.register_magic_function(sbatch, magic_kind="cell", magic_name="sbatch")
