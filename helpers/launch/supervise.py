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
from helpers.launch.quiet import UNECHOED
from helpers.launch.results import PEER_ERROR, RunResult

_PREFIX = re.compile(r"^\[rank(\d+)\] ?(.*)$")


# torchrun's agent logs these when a worker exits with an error.
_AGENT_SAW_FAILURE = re.compile(r"failed \(exitcode|closing signal SIG")
GRACE_S = 10  # after a worker failed, seconds torchrun gets to stop the others itself


class _Relay:
    """Splits torchrun's tagged output back per rank: logs, live echo, tracebacks."""

    def __init__(self, nproc: int, run_dir: Path, stream: bool):
        self.stream = stream
        self.rank_logs = {r: open(run_dir / "logs" / f"rank{r}.log", "w") for r in range(nproc)}
        self.agent_log = open(run_dir / "logs" / "torchrun.log", "w")
        self.lines: dict[int, list[str]] = {r: [] for r in range(nproc)}
        self.errs: dict[int, list[str]] = {r: [] for r in range(nproc)}
        self.first_tb: list[int] = []  # ranks in the order their tracebacks began
        self.failed_at: float | None = None  # when torchrun reported a failed worker
        self.agent: list[str] = []

    def line(self, line: str, is_err: bool) -> None:
        m = _PREFIX.match(line)
        if not m or int(m.group(1)) not in self.lines:
            self.agent.append(line)
            if _AGENT_SAW_FAILURE.search(line) and self.failed_at is None:
                self.failed_at = time.monotonic()
            self.agent_log.write(line + "\n")
            return
        r, text = int(m.group(1)), m.group(2)
        if text.startswith(f"[rank{r}]: "):  # torch tags error lines itself
            text = text[len(f"[rank{r}]: ") :]
        self.lines[r].append(text)
        self.rank_logs[r].write(text + "\n")
        self.rank_logs[r].flush()
        if is_err:
            self.errs[r].append(text)
            if text.startswith("Traceback (most recent call last)") and r not in self.first_tb:
                self.first_tb.append(r)
        if self.stream and not UNECHOED.match(text):  # library chatter: in the log only
            print(f"[rank{r}] {text}", file=sys.stderr if is_err else sys.stdout, flush=True)

    def close(self) -> None:
        for f in (*self.rank_logs.values(), self.agent_log):
            f.close()


def _start(cmd, env) -> subprocess.Popen:
    # torchrun runs under helpers.launch.reaper, in a session of its own: the reaper
    # stops every rank when we ask (timeout, Ctrl-C) and when this process dies,
    # because then its stdin pipe closes.
    return subprocess.Popen(
        [sys.executable, "-m", "helpers.launch.reaper", "--", *cmd],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )


def _pump(proc: subprocess.Popen, relay: _Relay, deadline: float) -> bool:
    """Relay output until torchrun's pipes close; stop it on failure or timeout.

    Returns True when the timeout stopped the run.
    """
    sel = selectors.DefaultSelector()
    partial = {proc.stdout: b"", proc.stderr: b""}
    for f in partial:
        sel.register(f, selectors.EVENT_READ)
    timed_out = False
    try:
        while sel.get_map():
            if relay.failed_at is not None:  # torchrun stops the rest; never wait long
                deadline = min(deadline, relay.failed_at + GRACE_S)
            if time.monotonic() > deadline:
                timed_out = relay.failed_at is None
                _kill_tree(proc)
                deadline = float("inf")
            for key, _ in sel.select(0.2):
                data = os.read(key.fileobj.fileno(), 1 << 16)
                if not data:
                    sel.unregister(key.fileobj)
                    data = b"\n" if partial[key.fileobj] else b""
                *done, partial[key.fileobj] = (partial[key.fileobj] + data).split(b"\n")
                for raw in done:
                    relay.line(raw.decode("utf-8", "replace"), key.fileobj is proc.stderr)
    finally:
        sel.close()
    return timed_out


def supervise(cmd, env, nproc, run_dir: Path, timeout, stream) -> RunResult:
    """Start torchrun, relay its tagged output, stop it on failure or timeout."""
    start = time.monotonic()
    proc = _start(cmd, env)
    relay = _Relay(nproc, run_dir, stream)
    try:
        timed_out = _pump(proc, relay, start + timeout)
        returncode = proc.wait()
        proc.stdin.close()
    except BaseException:  # KeyboardInterrupt in the notebook: stop every rank
        _kill_tree(proc)
        raise
    finally:
        relay.close()
    ok = returncode == 0 and not timed_out
    failed_rank, tb = (None, "") if ok else _root_cause(relay.errs, relay.first_tb, relay.agent)
    if not ok and not tb and stream:
        # No rank printed a traceback (bad torchrun arguments, a crash): show torchrun's words.
        print("\n".join(relay.agent[-30:]), file=sys.stderr, flush=True)
    if timed_out and stream:
        print(f"[launch] stopped every rank after the {timeout:g} s timeout", file=sys.stderr)
    return RunResult(
        ok=ok,
        returncode=returncode,
        run_dir=run_dir,
        command=cmd,
        wall_time=time.monotonic() - start,
        logs={r: "\n".join(v) for r, v in relay.lines.items()},
        metrics=runs.read_metrics(run_dir / "metrics.json"),
        failed_rank=failed_rank,
        traceback=tb or "\n".join(relay.agent[-30:]),
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
