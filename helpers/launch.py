"""Launching multi-rank programs from a notebook (or a test, or a shell).

    run(program, nproc=4, name=None, args=(), timeout=600, ...) -> RunResult
        torchrun a program file locally; live rank-prefixed output; kills every
        rank when one fails and returns that rank's traceback; keeps
        runs/NAME/<id>/.
    spawn(fn, world_size=4, args=(), timeout=120) -> list
        run fn(d: Dist, *args) on N gloo ranks from a warm pool (helpers.pool);
        returns each rank's return value; re-raises a rank's exception naming it.
    torchrun_command(program, nproc, ...) -> list[str]
        the one torchrun command line, shared with helpers.slurm job scripts.

run() is the real thing a cluster job does (a program file, torchrun, fresh
processes: several seconds of start-up). spawn() is for trying an idea from a
notebook cell in about a second.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from helpers import runs
from helpers.supervise import PEER_ERROR, supervise  # noqa: F401  (PEER_ERROR re-exported)

__all__ = [
    "RankFailure",
    "RunResult",
    "run",
    "spawn",
    "warm_up",
    "environment",
    "torchrun_command",
    "free_port",
    "threads_per_rank",
]


class RankFailure(RuntimeError):
    """A rank of a run() or spawn() failed; the message names it and carries its traceback.

    Attributes: rank (int or None), summary (one line), remote_traceback (str),
    original (the rank's exception object when it could be sent back, else None).
    """

    def __init__(self, rank, summary: str, remote_traceback: str = "", original=None):
        self.rank, self.summary = rank, summary
        self.remote_traceback, self.original = remote_traceback, original
        who = f"rank {rank}" if rank is not None else "the run"
        text = f"{who} failed: {summary}"
        if remote_traceback:
            text += f"\n\n--- traceback from {who} ---\n{remote_traceback.rstrip()}"
        super().__init__(text)

    def __reduce__(self):  # picklable, so it survives crossing processes itself
        return (type(self), (self.rank, self.summary, self.remote_traceback))


@dataclass
class RunResult:
    """What one run() left behind (everything is also on disk in run_dir)."""

    ok: bool
    returncode: int | None
    run_dir: Path
    command: list[str]
    wall_time: float
    logs: dict[int, str] = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    failed_rank: int | None = None
    traceback: str = ""
    timed_out: bool = False

    def raise_for_status(self) -> RunResult:
        """Raise RankFailure naming the failing rank (with its traceback) unless ok."""
        if self.ok:
            return self
        if self.timed_out:
            summary = (
                f"timed out after {self.wall_time:.0f} s and was stopped (logs in {self.run_dir})"
            )
        else:
            last = [ln for ln in self.traceback.splitlines() if ln.strip()][-1:]
            summary = (f"{last[0].strip()} " if last and self.failed_rank is not None else "") + (
                f"(torchrun exit code {self.returncode}, logs in {self.run_dir})"
            )
        raise RankFailure(self.failed_rank, summary, self.traceback)

    def __repr__(self) -> str:
        state = (
            "ok"
            if self.ok
            else ("timed out" if self.timed_out else f"failed rank {self.failed_rank}")
        )
        return f"RunResult({state}, {self.wall_time:.1f} s, metrics={self.metrics}, run_dir='{self.run_dir}')"


# --------------------------------------------------------------------------- small pieces


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


def _check_nproc(n, what: str) -> int:
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
        "backend ranks will use": "nccl" if gpus else "gloo",
        f"threads per rank with {nproc} ranks": threads_per_rank(nproc, cores),
        "distributed available": torch.distributed.is_available(),
    }


# --------------------------------------------------------------------------- spawn


def warm_up() -> None:
    """Start spawn()'s pool now, so the first spawn() does not pay for importing torch."""
    from helpers.pool import get_pool

    get_pool().start()


def spawn(
    fn: Callable,
    world_size: int = 4,
    args: Sequence = (),
    timeout: float = 120,
    backend: str = "gloo",
    threads: int | None = None,
) -> list:
    """Run ``fn(d, *args)`` on ``world_size`` ranks and return their values, index = rank.

    fn may be defined in the notebook (even a lambda or a closure): it is sent by
    value. ``d`` is the helpers.dist.Dist each rank gets from helpers.dist.init().
    Output printed by a rank appears here prefixed with ``[rankN]``. If a rank
    raises, the others are stopped and RankFailure names the rank and shows its
    traceback. After ``timeout`` seconds every rank is stopped.
    """
    import cloudpickle

    from helpers.pool import get_pool

    if not callable(fn):
        raise TypeError(f"spawn needs a function fn(d, *args), got {fn!r}")
    _check_nproc(world_size, "world_size")
    try:
        payload = cloudpickle.dumps((fn, tuple(args)))
    except Exception as e:
        raise TypeError(
            f"spawn could not send {getattr(fn, '__name__', fn)!r} and its args to the ranks: {e}. "
            "Pass plain values (numbers, tensors, lists) and define the function in the notebook."
        ) from e
    return get_pool().run(
        payload,
        world_size,
        port=free_port(),
        threads=threads or threads_per_rank(world_size),
        backend=backend,
        timeout=timeout,
    )


# --------------------------------------------------------------------------- run


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
    nproc = _check_nproc(nproc, "nproc")
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
