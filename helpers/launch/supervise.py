"""Watching a torchrun launch: rank-tagged output, the failing rank, stopping everything.

Used by helpers.launch.run(). torchrun (with ``--tee 3`` and a ``[rank${rank}] ``
line prefix) echoes every rank's stdout and stderr; this module splits those
lines back per rank, writes ``logs/rank<N>.log``, and decides which rank
caused a failure: the first whose traceback is its own, rather than a gloo/NCCL
error saying that a peer vanished.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers import runs
from helpers.launch.results import PEER_ERROR, RunResult

_PREFIX = re.compile(r"^\[rank(\d+)\] ?(.*)$")


# torchrun's agent logs these when a worker exits with an error.
_AGENT_SAW_FAILURE = re.compile(r"failed \(exitcode|closing signal SIG")
GRACE_S = 10  # after a worker failed, seconds torchrun gets to stop the others itself


def supervise(cmd, env, nproc, run_dir: Path, timeout, stream) -> RunResult:
    """Start torchrun, relay its tagged output, stop it on failure or timeout."""
    start = time.monotonic()
    # torchrun runs under helpers.launch.reaper, in a session of its own: the reaper
    # stops every rank when we ask (timeout, Ctrl-C) and when this process dies,
    # because then its stdin pipe closes.
    proc = subprocess.Popen(
        [sys.executable, "-m", "helpers.launch.reaper", "--", *cmd],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    rank_logs = {r: open(run_dir / "logs" / f"rank{r}.log", "w") for r in range(nproc)}
    agent_log = open(run_dir / "logs" / "torchrun.log", "w")
    lines: dict[int, list[str]] = {r: [] for r in range(nproc)}
    errs: dict[int, list[str]] = {r: [] for r in range(nproc)}
    first_tb: list[int] = []  # ranks in the order their tracebacks began
    failed_at: list[float] = []  # when torchrun reported a failed worker
    agent: list[str] = []
    sel = selectors.DefaultSelector()
    partial = {proc.stdout: b"", proc.stderr: b""}
    for f in partial:
        sel.register(f, selectors.EVENT_READ)

    def handle(line: str, is_err: bool) -> None:
        m = _PREFIX.match(line)
        if not m or int(m.group(1)) not in lines:
            agent.append(line)
            if _AGENT_SAW_FAILURE.search(line) and not failed_at:
                failed_at.append(time.monotonic())
            agent_log.write(line + "\n")
            return
        r, text = int(m.group(1)), m.group(2)
        if text.startswith(f"[rank{r}]: "):  # torch tags error lines itself
            text = text[len(f"[rank{r}]: ") :]
        lines[r].append(text)
        rank_logs[r].write(text + "\n")
        rank_logs[r].flush()
        if is_err:
            errs[r].append(text)
            if text.startswith("Traceback (most recent call last)") and r not in first_tb:
                first_tb.append(r)
        if stream:
            print(f"[rank{r}] {text}", file=sys.stderr if is_err else sys.stdout, flush=True)

    timed_out = False
    stop_at = start + timeout
    try:
        while sel.get_map():
            if failed_at:  # a rank died: torchrun stops the rest; never wait long for it
                stop_at = min(stop_at, failed_at[0] + GRACE_S)
            if time.monotonic() > stop_at:
                timed_out = not failed_at
                _kill_tree(proc)
                stop_at = float("inf")
            for key, _ in sel.select(0.2):
                data = os.read(key.fileobj.fileno(), 1 << 16)
                if not data:
                    sel.unregister(key.fileobj)
                    data = b"\n" if partial[key.fileobj] else b""
                *done, partial[key.fileobj] = (partial[key.fileobj] + data).split(b"\n")
                for raw in done:
                    handle(raw.decode("utf-8", "replace"), key.fileobj is proc.stderr)
        returncode = proc.wait()
        proc.stdin.close()
    except BaseException:  # KeyboardInterrupt in the notebook: stop every rank
        _kill_tree(proc)
        raise
    finally:
        sel.close()
        for f in (*rank_logs.values(), agent_log):
            f.close()
    wall = time.monotonic() - start
    ok = returncode == 0 and not timed_out
    failed_rank, tb = (None, "") if ok else _root_cause(errs, first_tb, agent)
    if not ok and not tb and stream:
        # No rank printed a traceback (bad torchrun arguments, a crash): show torchrun's words.
        print("\n".join(agent[-30:]), file=sys.stderr, flush=True)
    if timed_out and stream:
        print(f"[launch] stopped every rank after the {timeout:g} s timeout", file=sys.stderr)
    return RunResult(
        ok=ok,
        returncode=returncode,
        run_dir=run_dir,
        command=cmd,
        wall_time=wall,
        logs={r: "\n".join(v) for r, v in lines.items()},
        metrics=runs.read_metrics(run_dir / "metrics.json"),
        failed_rank=failed_rank,
        traceback=tb or "\n".join(agent[-30:]),
        timed_out=timed_out,
    )


def _root_cause(errs, first_tb, agent) -> tuple[int | None, str]:
    """The rank whose own error started the failure, and its traceback."""

    def tb_of(r: int) -> str:
        text = errs[r]
        i = next(i for i, line in enumerate(text) if line.startswith("Traceback (most"))
        return "\n".join(text[i:])

    # Prefer a rank whose error is its own (not a peer's death seen through gloo/NCCL).
    own = [r for r in first_tb if not PEER_ERROR.search(tb_of(r))]
    if own:
        return own[0], tb_of(own[0])
    # Otherwise trust torchrun's "Root Cause" section, then the first traceback.
    summary = "\n".join(agent)
    m = re.search(r"Root Cause.*?rank\s*:\s*(\d+)", summary, re.S)
    if m and int(m.group(1)) in errs:
        r = int(m.group(1))
        return r, tb_of(r) if r in first_tb else ""
    if first_tb:
        return first_tb[0], tb_of(first_tb[0])
    return None, ""


def _kill_tree(proc: subprocess.Popen) -> None:
    """Ask the reaper to stop torchrun and every rank, and wait until it has.

    The reaper does the SIGTERM-then-SIGKILL sequence in its own process, so a
    second Ctrl-C here cannot cut it short; we only wait for it (and kill it, and
    thereby close its stdin, if it does not answer).
    """
    try:
        proc.stdin.close()
        proc.send_signal(signal.SIGTERM)
    except (OSError, ValueError):
        pass
    for _ in range(2):
        try:
            proc.wait(timeout=15)
            return
        except subprocess.TimeoutExpired:
            proc.kill()
        except KeyboardInterrupt:  # a second Ctrl-C: the reaper finishes the job anyway
            continue
