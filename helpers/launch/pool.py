"""A warm pool that runs a notebook-defined function on N gloo ranks in about a second.

Starting N fresh interpreters that each ``import torch`` costs several seconds.
Instead, one helper process (the *zygote*, helpers.launch.zygote) imports
torch once and then forks a fresh worker per rank on request. Forking is safe
because the zygote never runs a torch operation, so no OpenMP or intra-op
thread pool exists yet; each worker sets its own thread count after the fork.

    notebook (parent)                      zygote (torch imported, single-threaded)
      | -- request: fn by value, N ---------> |  listen on a port, fork x N
      |                                      |-- worker rank 0 .. N-1
      | <== out / err / result sockets ===== |     (each joins the gloo group)
      | <-- exit codes --------------------- |  reaps workers, kills on request

The function travels by value with cloudpickle, so functions and lambdas
defined in a notebook cell (whose ``__main__`` has no file to import) work.
The zygote is a separate interpreter started with ``-m``: it never imports the
caller's ``__main__``, whether that is Jupyter, pytest, papermill or a script.
"""

from __future__ import annotations

import atexit
import linecache
import os
import pickle
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time

from helpers.launch.framing import HELLO, recv, send
from helpers.launch.procs import package_pythonpath
from helpers.launch.quiet import rank_environment
from helpers.launch.results import RankFailure
from helpers.launch.spawnjob import SpawnJob, loads_or_none

# --------------------------------------------------------------------------- parent side


class Pool:
    """The caller's handle on one zygote; started on first use, restarted if it died."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._ready = False  # the zygote said "ready" (torch imported)
        self._lock = threading.Lock()
        self._jobs = 0  # spawn() calls so far: exit reports carry the number of their call
        atexit.register(self.close)

    # -- zygote lifetime
    def start(self, timeout: float = 120.0, wait: bool = True) -> None:
        """Start the zygote (it takes a few seconds to import torch).

        ``wait=False`` returns at once: the zygote imports torch while the caller
        goes on (a lab's first cells, nbgrader sending the next cell), and the
        first run() waits for what is left of its start.
        """
        if self._proc is None or self._proc.poll() is not None:
            env = {**os.environ, "PYTHONPATH": package_pythonpath(os.environ.get("PYTHONPATH"))}
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "helpers.launch.zygote"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                start_new_session=True,  # a Ctrl-C in the notebook is handled by us, not it
            )
            self._ready = False
        if wait and not self._ready:
            self._await_ready(timeout)

    def _await_ready(self, timeout: float) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._proc.stdout, selectors.EVENT_READ)
        ok = sel.select(timeout)
        sel.close()
        msg = recv(self._proc.stdout.fileno()) if ok else None
        if not msg or "ready" not in msg:
            self.close()
            raise RuntimeError(
                "the spawn pool's helper process did not start (python -m helpers.launch.zygote); "
                "run it by hand to see why"
            )
        self._ready = True

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()  # EOF: the zygote kills its workers and exits
            proc.wait(timeout=5)
        except Exception:
            proc.kill()
            proc.wait()

    # -- one job
    def run(
        self,
        payload: bytes,
        world_size: int,
        *,
        threads: int,
        backend: str,
        timeout: float,
    ) -> list:
        with self._lock:
            self.start()
            try:
                return self._run(payload, world_size, threads, backend, timeout)
            except BaseException:
                if self._proc is not None and self._proc.poll() is not None:
                    self._proc = None  # the zygote died: start a fresh one next time
                raise

    def _run(self, payload, world_size, threads, backend, timeout) -> list:
        tmp = tempfile.mkdtemp(prefix="wb-spawn-")
        path = os.path.join(tmp, "s")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(3 * world_size)
        job = SpawnJob(world_size)
        self._jobs += 1
        job.id = self._jobs
        sel = selectors.DefaultSelector()
        sel.register(listener, selectors.EVENT_READ, "accept")
        sel.register(self._proc.stdout, selectors.EVENT_READ, "zygote")
        request = _request(job.id, path, world_size, threads, backend, timeout, payload)
        try:
            send(self._proc.stdin.fileno(), {"spawn": request})
            self._wait(job, sel, listener, time.monotonic() + timeout)
            self._read_remaining_output(job, sel)
        except BaseException as e:  # KeyboardInterrupt included: never leave ranks behind
            self._kill_workers()
            if not isinstance(e, Exception):
                # An interrupt can land between a message's length and its body: the
                # zygote's stream is then out of step, and reading on would block for
                # ever. Close it (EOF: it kills its workers and exits); the next call
                # starts a fresh one.
                self.close()
            raise
        finally:
            job.flush_output()
            for key in list(sel.get_map().values()):
                if key.data not in ("zygote",):
                    key.fileobj.close()
            sel.close()
            os.unlink(path)
            os.rmdir(tmp)
            if self._proc is not None and not job.finished():
                self._drain_exits(job)
        return _outcome(job, timeout)

    def _kill_workers(self) -> None:
        try:
            send(self._proc.stdin.fileno(), {"kill": True})
        except OSError:
            pass

    def _wait(self, job: SpawnJob, sel, listener, deadline: float) -> None:
        """Relay output and results until every worker exited, one failed, or time is up."""
        while not job.finished():
            if len(job.exits) == job.n:
                # Everyone is gone: their connections are queued, accept them all.
                listener.setblocking(False)
                while True:
                    try:
                        self._on_ready(sel.get_key(listener), sel, job)
                    except BlockingIOError:
                        break
                if job.finished():
                    break
            if job.first_failure and not job.killed:
                # A rank that only saw its peer vanish is not the story: give the rank
                # that actually failed time to report first (its exit can take a few
                # seconds to reach us on a loaded 2-core machine). After a rank's own
                # error, wait a second for the others, so "all 4 ranks raised X" can be said
                # (0.3 s was too short for 4 ranks on 2 busy cores: CI saw 2 of 4 report).
                grace = 1.0 if job.own_failure() else 3.0
                if (
                    len(job.accounted_ranks()) >= job.n
                    or time.monotonic() >= job.first_failure + grace
                ):
                    self._kill_workers()
                    job.killed, deadline = True, min(deadline, time.monotonic() + 5)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _ in sel.select(min(left, 0.1)):
                self._on_ready(key, sel, job)
        if not job.finished():  # timed out, or workers did not die when asked
            job.timed_out = not job.killed
            job.killed = True
            self._kill_workers()

    def _read_remaining_output(self, job: SpawnJob, sel) -> None:
        """Workers have exited: read what is still in flight on their output sockets."""
        end = time.monotonic() + 1.0
        while time.monotonic() < end and any(
            isinstance(k.data, tuple) for k in sel.get_map().values()
        ):
            for key, _ in sel.select(0.1):
                if isinstance(key.data, tuple):
                    self._on_ready(key, sel, job)

    def _on_ready(self, key, sel, job) -> None:
        if key.data == "accept":
            conn, _ = key.fileobj.accept()
            conn.settimeout(5)
            hello = conn.recv(HELLO, socket.MSG_WAITALL).decode()
            conn.setblocking(False)
            kind, rank = hello[0], int(hello[1:])
            sel.register(conn, selectors.EVENT_READ, (kind, rank))
            if kind == "r":
                job.r_connected.add(rank)
        elif key.data == "zygote":
            msg = recv(self._proc.stdout.fileno())
            if msg is None:
                raise RuntimeError("the spawn pool's helper process died")
            # An exit report of an earlier, interrupted call is stale: never blame this call's ranks.
            if "exit" in msg and msg.get("job") == job.id:
                job.exited(msg["exit"], msg["code"])
        else:
            kind, rank = key.data
            data = key.fileobj.recv(1 << 16)
            if data:
                job.feed(kind, rank, data)
            else:
                sel.unregister(key.fileobj)
                key.fileobj.close()
                job.closed(kind, rank)

    def _drain_exits(self, job, wait: float = 5.0) -> None:
        """Collect the zygote's exit reports for killed workers (keeps the protocol in step)."""
        fd = self._proc.stdout.fileno()
        end = time.monotonic() + wait
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        while len(job.exits) < job.n and time.monotonic() < end:
            if sel.select(end - time.monotonic()):
                msg = recv(fd)
                if msg is None:
                    break
                if "exit" in msg and msg.get("job") == job.id:
                    job.exited(msg["exit"], msg["code"])
        sel.close()
        if len(job.exits) < job.n:  # workers we cannot account for: start afresh
            self._proc.kill()
            self._proc.wait()
            self._proc = None


def _request(job_id, sock, world_size, threads, backend, timeout, payload) -> dict:
    """What the zygote needs to fork the ranks of one spawn() call (it picks the port)."""
    return dict(
        job=job_id,
        sock=sock,
        world_size=world_size,
        threads=threads,
        backend=backend,
        timeout=timeout,
        payload=payload,
        cwd=os.getcwd(),
        env={**os.environ, **rank_environment()},  # library noise off (launch.quiet)
        path=list(sys.path),
        # Source of notebook cells (not files on disk), so tracebacks show the lines.
        sources={k: v for k, v in linecache.cache.items() if len(v) == 4 and v[1] is None},
    )


def _outcome(job: SpawnJob, timeout: float) -> list:
    """Every rank's return value, or the RankFailure that tells the learner what went wrong."""
    cause = job.root_cause()
    if cause and cause[0] == "error":
        _, rank, tb, exc, summary = cause
        raise RankFailure(rank, summary, tb, original=loads_or_none(exc), **job.failure_census())
    if cause:
        _, rank, code = cause
        raise RankFailure(rank, f"the process exited with code {code} without a result", "")
    if not job.complete():
        missing = [r for r in range(job.n) if r not in job.values]
        raise RankFailure(
            missing[0] if len(missing) == 1 else None,  # one straggler is named
            f"timed out after {timeout:g} s; ranks {missing} had not returned "
            "(a collective that not every rank calls waits until the timeout: check that "
            "all ranks make the same collective calls in the same order)",
            "",
        )
    return [pickle.loads(job.values[r]) for r in range(job.n)]


_POOL: Pool | None = None


def get_pool() -> Pool:
    """The process-wide pool (one zygote per notebook kernel, test session or script)."""
    global _POOL
    if _POOL is None:
        _POOL = Pool()
    return _POOL
