"""The ``%%sbatch`` cell: save the cell as programs/NAME.py, then write and submit its job.

    %%sbatch allreduce --nodes 2 --gpus-per-node 4 --profile engaging --set env=torch
    ...program text...

Options: --time 00:10:00, --args "...", --set FIELD=VALUE (profile fields such
as account), --submit (default: submit when Slurm is reachable) or
--write-only, --wait, --resubmit (run again although this exact job exists),
--as VAR (the variable that receives the Job; default ``job``), --nsys,
--nccl-debug. Registered by ``%load_ext helpers`` through
``helpers.slurm.sbatch_magic``.
"""

from __future__ import annotations

import argparse
import shlex

from helpers.jobscript import check_job_name
from helpers.magics import write_program  # the same programs/NAME.py as %%torchrun
from helpers.slurm import Job

__all__ = ["run_cell"]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # raise instead of exiting the kernel
        raise ValueError(message)


def _magic_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="%%sbatch", add_help=False)
    p.add_argument("name")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpus-per-node", type=int, default=1)
    p.add_argument("--profile", default="local")
    p.add_argument("--time", default="00:10:00")
    p.add_argument("--args", default="", help="program arguments, one quoted string")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument("--as", dest="var", default="job", help="variable that receives the Job")
    p.add_argument("--nsys", action="store_true")
    p.add_argument("--nccl-debug", action="store_true")
    p.add_argument("--resubmit", action="store_true")
    p.add_argument("--wait", action="store_true")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--submit", dest="write_only", action="store_false")
    mode.add_argument("--write-only", dest="write_only", action="store_true")
    p.set_defaults(write_only=False)  # submit when Slurm is reachable
    return p


def run_cell(line: str, cell: str, ipython=None) -> Job:
    """``%%sbatch NAME [--nodes N] [--gpus-per-node G] [--profile P] [--time T] ...``"""
    usage = (
        "usage: %%sbatch NAME [--nodes N] [--gpus-per-node G] [--profile local] "
        "[--time 00:10:00] [--set field=value] [--args '...'] [--submit | --write-only] "
        "[--wait] [--resubmit] [--as VAR] [--nsys] [--nccl-debug]"
    )
    try:
        opts = _magic_parser().parse_args(shlex.split(line))
    except ValueError as e:
        raise ValueError(f"could not read '%%sbatch {line}': {e}\n{usage}") from None
    if not opts.var.isidentifier():
        raise ValueError(f"%%sbatch: --as needs a Python variable name, got {opts.var!r}")
    values = {}
    for item in opts.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"%%sbatch: --set wants FIELD=VALUE, got {item!r}")
        values[key] = value
    program = write_program(check_job_name(opts.name), cell)
    job = Job(
        opts.name,
        program,
        nodes=opts.nodes,
        gpus_per_node=opts.gpus_per_node,
        profile=opts.profile,
        time=opts.time,
        args=shlex.split(opts.args),
        values=values,
        nsys=opts.nsys,
        nccl_debug=opts.nccl_debug,
    )
    if opts.write_only:
        print(f"wrote {job.write()} (write-only: submit with {opts.var}.submit())")
    else:
        job.submit(force=opts.resubmit)
        if opts.wait and job.job_id:
            job.wait()
    if ipython is not None:
        ipython.user_ns[opts.var] = job
        print(f"the Job is in variable `{opts.var}`")
    return job
