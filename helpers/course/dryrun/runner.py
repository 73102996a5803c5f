"""Start the ranks of a check: fake ranks of a full-size job, or strict ranks on CPU.

Each rank is a fresh process forked from a server that imported torch once
(multiprocessing's forkserver), so one program's state never leaks into the next and no
rank pays torch's import again. Fake ranks run alone (nothing to talk to): rank 0 first,
and the last rank too when rank 0 sent or received point-to-point messages, since only
pipeline stages differ from one another (except a later stage of a DeepSpeed pipeline, which
waits for shapes sent at run time: its row then says "rank 0 only"). The strict ranks rendezvous on a free local port
and really exchange their tensors over gloo, under NCCL's rules (``helpers.standin``).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
import socket
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["run_ranks", "run_fake"]

_PRELOAD = ["torch", "torch.distributed", "torch.distributed.fsdp", "torch.distributed.tensor",
            "torch._subclasses.fake_tensor", "helpers.dist", "helpers.course.dryrun.fake"]  # fmt: skip
_context = None


def _forkserver():
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(_PRELOAD)
    return _context


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(spec_path: str, log_path: str) -> None:
    """A forked rank: its output to its log, then the check (helpers.course.dryrun.child)."""
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    from helpers.course.dryrun import child

    code = child.main(spec_path)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the rank's verdict is its exit code: a peer that failed ends the others


def run_ranks(
    program: Path,
    argv: list[str],
    mode: str,
    world: int,
    ranks: list[int] | None = None,
    gpu: str = "h100",
    gpus_per_node: int | None = None,
    small: bool = False,
    timeout: float = 300.0,
    max_steps: int = 2,
    host_limit: tuple[int, str] | None = None,
    gpu_marks: tuple[int, ...] = (),
) -> list[dict]:
    """Run ``ranks`` of a ``world``-rank job of ``program`` and return each rank's result.

    host_limit: (bytes, why) a fake rank may hold on the host before it stops, naming the line.
    gpu_marks: GPU bytes (each GPU's usable memory) where a fake rank notes the line that
    first passes them: where CUDA would run out of memory.

    mode "fake": each rank alone, at full size. mode "strict": every rank of the world at
    once (keep it small: 2), with ``small`` asking programs for their laptop sizes.
    """
    ranks = list(range(world)) if ranks is None else ranks
    per_node = gpus_per_node or world
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="dryrun-") as tmp:
        procs = []
        for r in ranks:
            spec = {"mode": mode, "program": str(program), "argv": [str(a) for a in argv],
                    "cwd": str(program.parent), "rank": r, "world": world,
                    "local_rank": r % per_node, "local_world": min(per_node, world),
                    "gpu": gpu, "small": small, "port": port, "max_steps": max_steps,
                    "host_limit": host_limit, "gpu_marks": list(gpu_marks), "result": str(Path(tmp) / f"rank{r}.json")}  # fmt: skip
            path = Path(tmp) / f"spec{r}.json"
            path.write_text(json.dumps(spec))
            proc = _forkserver().Process(target=_rank_main, args=(str(path), f"{tmp}/rank{r}.log"))
            proc.start()
            procs.append((r, proc))
        _wait(procs, timeout, together=(mode == "strict"))
        return [_result(Path(tmp), r, p) for r, p in procs]


def _waits_for_run_time_shapes(result: dict) -> bool:
    """DeepSpeed's pipeline sends each stage the shapes of the tensors it will receive, at run
    time, before the first activation: a later stage run alone has nobody to hear them from,
    and fails its assertion on what it read instead. Only that failure, where it happens."""
    frames = re.findall(r'File "([^"]+)", line \d+, in (\w+)', result.get("traceback", ""))
    return (
        not result.get("ok")
        and result.get("error", "").startswith("AssertionError")
        and bool(frames)
        and frames[-1][0].endswith("deepspeed/runtime/pipe/engine.py")
        and frames[-1][1] == "_exec_recv_activations"
    )


def run_fake(program: Path, argv: list[str], world: int, **kw) -> list[dict]:
    """Rank 0 of a full-size job on fake tensors; the last rank too if they can differ."""
    first = run_ranks(program, argv, "fake", world, [0], **kw)
    if world > 1 and first[0].get("point_to_point"):
        last = run_ranks(program, argv, "fake", world, [world - 1], **kw)
        if not _waits_for_run_time_shapes(last[0]):
            return first + last
        first[0]["note"] = (f"rank 0 only, its memory too: rank {world - 1} waits for the shapes "
                            "DeepSpeed's pipeline sends at run time, which a rank alone cannot "
                            "receive")  # fmt: skip
    return first


def _wait(procs, timeout: float, together: bool) -> None:
    """Wait for every rank; when ranks talk to each other, one that fails ends the rest."""
    deadline = time.monotonic() + timeout
    while any(p.is_alive() for _, p in procs):
        failed = together and any(p.exitcode not in (None, 0) for _, p in procs)
        if time.monotonic() > deadline or failed:
            time.sleep(3 if failed else 0)  # a failing peer's partner: a moment to report
            for _, p in procs:
                if p.is_alive():
                    p.kill()
            break
        time.sleep(0.05)
    for _, p in procs:
        p.join()


def _result(tmp: Path, rank: int, proc) -> dict:
    path, log = tmp / f"rank{rank}.json", tmp / f"rank{rank}.log"
    output = log.read_text(errors="replace") if log.is_file() else ""
    if path.is_file():
        out = json.loads(path.read_text())
    else:  # killed, or died before it could write (a segfault, a peer's failure)
        out = {"rank": rank, "ok": False, "reached": "started", "steps": 0,
               "error": f"rank {rank} ended with exit code {proc.exitcode} and no report "
                        "(killed after a peer failed, or past the time limit)"}  # fmt: skip
    out["output_tail"] = output[-3000:]
    with contextlib.suppress(Exception):
        proc.close()
    return out
