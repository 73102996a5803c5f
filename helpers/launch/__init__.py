"""Launching multi-rank programs from a notebook (or a test, or a shell).

    run(program, nproc=4, name=None, args=(), timeout=600, ...) -> RunResult
        torchrun a program file locally; live rank-prefixed output; kills every
        rank when one fails and returns that rank's traceback; keeps
        runs/NAME/<id>/.
    spawn(fn, world_size=4, args=(), timeout=120) -> list
        run fn(d: Dist, *args) on N gloo ranks from a warm pool (helpers.launch.pool);
        returns each rank's return value; re-raises a rank's exception naming it.
    torchrun_command(program, nproc, ...) -> list[str]
        the one torchrun command line, shared with helpers.cluster.job job scripts.

run() is the real thing a cluster job does (a program file, torchrun, fresh
processes: several seconds of start-up). spawn() is for trying an idea from a
notebook cell in about a second.
"""

from __future__ import annotations

from helpers.launch.quiet import quiet_kernel
from helpers.launch.results import PEER_ERROR, RankFailure, RunResult
from helpers.launch.spawn import spawn, warm_up
from helpers.launch.torchrun import (
    environment,
    free_port,
    run,
    threads_per_rank,
    torchrun_command,
    workbook_pythonpath,
)

__all__ = [
    "PEER_ERROR",
    "RankFailure",
    "RunResult",
    "environment",
    "free_port",
    "run",
    "spawn",
    "threads_per_rank",
    "torchrun_command",
    "warm_up",
    "workbook_pythonpath",
]

quiet_kernel()  # library messages that say nothing to a learner (helpers.launch.quiet)
