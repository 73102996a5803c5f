"""run(): torchrun a program file on local ranks, supervised, kept in runs/NAME/<id>/.

Also the pieces shared with Slurm job scripts: the one torchrun command line,
free ports, and how many threads each rank gets.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from helpers import runs
from helpers.launch.quiet import rank_environment
from helpers.launch.results import RunResult
from helpers.launch.supervise import supervise

__all__ = [
    "check_nproc",
    "environment",
    "free_port",
    "run",
    "threads_per_rank",
    "torchrun_command",
    "workbook_pythonpath",
]


def free_port() -> int:
    """A TCP port that was free a moment ago (for a local rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def threads_per_rank(nproc: int, cores: int | None = None) -> int:
    """Split the machine's cores between ranks so N ranks do not oversubscribe."""
    if cores is None:
        has_affinity = hasattr(os, "sched_getaffinity")
        cores = len(os.sched_getaffinity(0)) if has_affinity else (os.cpu_count() or 1)
    return max(1, cores // max(1, nproc))


def torchrun_command(
    program: str,
    nproc: int | str,
    *,
    nnodes: int | str = 1,
    rdzv_endpoint: str = "localhost:29500",
    rdzv_id: str | None = None,
    args: Sequence[str] = (),
    exe: Sequence[str] = ("torchrun",),
    options: Sequence[str] = (),
) -> list[str]:
    """The torchrun command line used everywhere (local runs and Slurm jobs).

    The c10d rendezvous (rather than --standalone) is what multi-node jobs need,
    so the laptop uses it too and the two commands differ only in values:

        torchrun --nnodes=1 --nproc-per-node=4 --rdzv-backend=c10d \\
                 --rdzv-endpoint=localhost:PORT --rdzv-id=ID prog.py [args]

    nproc/nnodes/rdzv_* may be shell variables ("$SLURM_NNODES") when the
    caller renders a job script; the caller is responsible for quoting.
    options: extra torchrun flags placed before the program (run() adds --tee).
    """
    cmd = [
        *exe,
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv_endpoint}",
    ]
    if rdzv_id is not None:
        cmd.append(f"--rdzv-id={rdzv_id}")
    return [*cmd, *options, str(program), *map(str, args)]


def check_nproc(n, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 64:
        raise ValueError(f"{what} must be an integer from 1 to 64, got {n!r}")
    return n


def workbook_pythonpath(extra: str | None = None) -> str:
    """PYTHONPATH that makes ``helpers`` importable in child processes."""
    root = str(Path(__file__).resolve().parent.parent)
    parts = [root, *(extra or "").split(os.pathsep)]
    return os.pathsep.join(dict.fromkeys(p for p in parts if p))  # dedupe, keep order


def environment(nproc: int = 4) -> dict:
    """What ranks started here will run on: versions, cores, GPUs, backend, threads."""
    import platform

    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu cores available": cores,
        "GPUs visible": gpus,
        "backend of torchrun programs": "nccl" if gpus else "gloo",  # as dist.init() picks
        f"threads per rank with {nproc} ranks": threads_per_rank(nproc, cores),
        "distributed available": torch.distributed.is_available(),
    }


def run(
    program: str | os.PathLike,
    nproc: int = 4,
    name: str | None = None,
    args: Sequence = (),
    timeout: float = 600,
    env: dict[str, str] | None = None,
    threads: int | None = None,
    stream: bool = True,
    check: bool = False,
) -> RunResult:
    """torchrun ``program`` on ``nproc`` local ranks and keep the run in runs/NAME/<id>/.

    Output streams live, each line prefixed ``[rankN]``. When a rank fails every
    rank is stopped and the result names it (failed_rank, traceback); after
    ``timeout`` seconds everything is stopped. check=True raises RankFailure
    instead of returning a failed result.
    """
    program = Path(program)
    if not program.is_file():
        raise FileNotFoundError(
            f"no program file {str(program)!r} (looked in {os.getcwd()}): "
            "write it first, e.g. with the %%torchrun cell magic, or fix the path"
        )
    nproc = check_nproc(nproc, "nproc")
    run_dir = runs.new_run_dir(name or program.stem)
    shutil.copy2(program, run_dir / "program.py")
    (run_dir / "logs").mkdir()
    threads = threads or threads_per_rank(nproc)
    cmd = torchrun_command(
        program.resolve(),
        nproc,
        rdzv_endpoint=f"localhost:{free_port()}",
        rdzv_id=run_dir.name,
        args=args,
        exe=[sys.executable, "-m", "torch.distributed.run"],
        # --tee: torchrun echoes each rank's stdout/stderr, tagged with the rank.
        options=[
            "--tee=3",
            f"--log-dir={run_dir / 'torchrun'}",
            "--log-line-prefix-template=[rank${rank}] ",
        ],
    )
    extra = {
        "OMP_NUM_THREADS": str(threads),
        runs.METRICS_ENV: str(run_dir / "metrics.json"),
        "PYTHONPATH": workbook_pythonpath(os.environ.get("PYTHONPATH")),
        "PYTHONUNBUFFERED": "1",  # ranks write to files: without this prints arrive at exit
        **rank_environment(),  # library noise off (helpers.launch.quiet)
        **(env or {}),
    }
    (run_dir / "command.txt").write_text(
        f"# cd {shlex.quote(os.getcwd())}\n"
        + " ".join(f"{k}={shlex.quote(v)}" for k, v in extra.items())
        + " \\\n  "
        + shlex.join(cmd)
        + "\n"
    )
    result = supervise(cmd, {**os.environ, **extra}, nproc, run_dir, timeout, stream)
    return result.raise_for_status() if check else result
