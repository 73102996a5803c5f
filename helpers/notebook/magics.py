"""Notebook cell magics: ``%load_ext helpers`` registers them.

%%program NAME
    Writes the cell to ``programs/NAME.py`` and runs it in the kernel (see
    helpers.notebook.program): the learner's code is graded in the kernel and
    imported by the jobs that %%sbatch submits.

%%torchrun -n 4 NAME [--timeout S] [--threads T] [--out VAR] [-- prog args]
    Writes the cell to ``programs/NAME.py`` (relative to the notebook's
    directory) and starts it with helpers.launch.run() on 4 local ranks. The
    file is an ordinary program: ``python programs/NAME.py`` (one process) and
    ``torchrun --nproc-per-node 4 programs/NAME.py`` start it by hand too.
    The RunResult is the cell's value (so ``_`` holds it), is stored as
    ``_torchrun`` in the notebook and, with ``--out VAR``, as ``VAR``.
    A failing run raises RankFailure, so papermill and "Run all" stop there.

%%sbatch NAME [--nodes N] [--gpus-per-node G] [--profile P] ...
    Writes the cell and submits it as a Slurm job (helpers.notebook.sbatch_cell).

Both launching magics parse their line with IPython's magic_arguments, so
``%%torchrun?`` and ``%%sbatch?`` show their options.
"""

from __future__ import annotations

import re
import shlex

from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from helpers import launch, runs
from helpers.notebook.program import program_magic, write_program
from helpers.notebook.sbatch_cell import sbatch_magic


def _usage_error(magic: str, line: str, e: BaseException) -> ValueError:
    return ValueError(f"could not read '%%{magic} {line}': {e}")


@magic_arguments()
@argument("name", help="program and run name: programs/NAME.py, runs/NAME/<id>/")
@argument("-n", "--nproc", type=int, default=4, help="number of ranks (default 4)")
@argument("--timeout", type=float, default=600, help="seconds before every rank is stopped")
@argument("--threads", type=int, default=None, help="threads per rank (default: cores/N)")
@argument("--out", default=None, help="also store the RunResult in this variable")
def torchrun_magic(line: str, cell: str, user_ns: dict | None = None) -> launch.RunResult:
    """%%torchrun -n 4 NAME [--timeout S] [--threads T] [--out VAR] [-- program args]

    Everything after a lone ``--`` is passed to the program.
    """
    opts = parse_line(line)
    path = write_program(opts.name, cell)
    result = launch.run(
        path,
        nproc=opts.nproc,
        name=opts.name,
        args=opts.prog_args,
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


def parse_line(line: str):
    """Options of a %%torchrun line ('-n 2 hello -- --epochs 3'); errors say what to fix."""
    # Program arguments follow a lone "--"; they are the program's, not ours.
    options, _, rest = (re.split(r"(?:^|\s)(--)(?:\s|$)", line, maxsplit=1) + ["", ""])[:3]
    try:
        opts = parse_argstring(torchrun_magic, options)
    except BaseException as e:  # UsageError, or SystemExit from argparse
        raise _usage_error("torchrun", line, e) from None
    opts.prog_args = shlex.split(rest)
    runs.check_name(opts.name)
    if not 1 <= opts.nproc <= 64:
        raise ValueError(f"%%torchrun: -n must be from 1 to 64, got {opts.nproc}")
    if opts.out is not None and not opts.out.isidentifier():
        raise ValueError(f"--out needs a Python variable name, got {opts.out!r}")
    return opts


def register(ipython) -> None:
    """Register %%program, %%torchrun and %%sbatch with an IPython shell."""

    def program(line, cell):
        program_magic(line, cell, ipython)  # no return value: nothing to echo under the cell

    def torchrun(line, cell):
        return torchrun_magic(line, cell, ipython.user_ns)

    def sbatch(line, cell):
        return sbatch_magic(line, cell, ipython)

    program.__doc__ = program_magic.__doc__
    torchrun.__doc__ = torchrun_magic.__doc__
    sbatch.__doc__ = sbatch_magic.__doc__
    for fn, name in ((program, "program"), (torchrun, "torchrun"), (sbatch, "sbatch")):
        ipython.register_magic_function(fn, magic_kind="cell", magic_name=name)
