"""The ``%%sbatch`` cell: save the cell as programs/NAME.py, then write and submit its job.

    %%sbatch allreduce --nodes 2 --gpus-per-node 4 --profile engaging --set env=torch
    ...program text...

Options: --time 00:10:00, --args "...", --set FIELD=VALUE (profile fields such
as account), --submit (default: submit when Slurm is reachable) or
--write-only, --wait, --resubmit (run again although this exact job exists),
--as VAR (the variable that receives the Job; default ``job``), --nsys,
--nccl-debug. Registered by ``%load_ext helpers``.

Under nbgrader (``NBGRADER_EXECUTION`` is set while it autogrades or validates)
the job is written but never submitted: grading never waits on a queue.
"""

from __future__ import annotations

import os
import shlex

from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from helpers.cluster.job import Job
from helpers.cluster.jobscript import check_job_name
from helpers.notebook.program import write_program  # the same programs/NAME.py as %%torchrun

__all__ = ["sbatch_magic"]


@magic_arguments()
@argument("name", help="job and program name: programs/NAME.py, runs/NAME/<id>/")
@argument("--nodes", type=int, default=1)
@argument("--gpus-per-node", type=int, default=1)
@argument("--profile", default="local", help="a cluster profile of slurm/profiles/")
@argument("--time", default="00:10:00")
@argument("--args", default="", help="program arguments, one quoted string")
@argument("--set", action="append", default=[], metavar="FIELD=VALUE")
@argument("--as", dest="var", default="job", help="variable that receives the Job")
@argument("--nsys", action="store_true")
@argument("--nccl-debug", action="store_true")
@argument("--resubmit", action="store_true")
@argument("--wait", action="store_true")
@argument("--write-only", action="store_true", help="write the job script, do not submit")
@argument("--submit", action="store_true", help="submit (the default when Slurm is reachable)")
def sbatch_magic(line: str, cell: str, ipython=None) -> Job:
    """%%sbatch NAME [--nodes N] [--gpus-per-node G] [--profile local] [--time 00:10:00]
    [--set field=value] [--args '...'] [--submit | --write-only] [--wait] [--resubmit]
    [--as VAR] [--nsys] [--nccl-debug]"""
    try:
        opts = parse_argstring(sbatch_magic, line)
    except BaseException as e:  # UsageError, or SystemExit from argparse
        raise ValueError(f"could not read '%%sbatch {line}': {e}\n{sbatch_magic.__doc__}") from None
    if opts.submit and opts.write_only:
        raise ValueError("%%sbatch: choose one of --submit and --write-only")
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
    grading = os.environ.get("NBGRADER_EXECUTION")  # 'autograde' or 'validate'
    if grading:
        # Grading stays in the kernel and never waits on a queue.
        print(f"nbgrader {grading}: wrote {job.write()} but did not submit it")
    elif opts.write_only:
        print(f"wrote {job.write()} (write-only: submit with {opts.var}.submit())")
    else:
        job.submit(force=opts.resubmit)
        if opts.wait and job.job_id:
            job.wait()
    if ipython is not None:
        ipython.user_ns[opts.var] = job
        print(f"the Job is in variable `{opts.var}`")
    return job
