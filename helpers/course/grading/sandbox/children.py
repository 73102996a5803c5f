"""Inside a sandbox slot: the forked children (a rank, the learner process) and their end.

``fork(target, *args)`` starts a child whose fd 1 and 2 are pipes to the slot and which
writes its result frames on a third; ``Child.pump`` forwards its output to the grader as
it comes and stops at a result frame, at the child's exit or at the grader's "kill".
``end_processes`` leaves nothing behind: every process of the sandbox but the slot (and
the ones named) is stopped, killed and reaped. ``wipe`` empties the writable places.
"""

from __future__ import annotations

import os
import select
import selectors
import shutil
import signal
import socket
import time

from helpers.course.grading.sandbox import wire

__all__ = ["Child", "end_processes", "fork", "wipe"]


class Child:
    """A forked child: its pipes (o, e: output; r: results; q: requests) and its pidfd."""

    def __init__(self, pid: int, pipes: dict[str, int], tag=None):
        self.pid, self.pipes, self.tag = pid, pipes, tag
        self.pidfd = os.pidfd_open(pid)
        self.reader = wire.Reader()
        self.results: list[tuple[dict, bytes]] = []
        self.garbled = False

    def alive(self) -> bool:
        """Not exited yet (its pidfd turns readable when it exits)."""
        return not select.select([self.pidfd], [], [], 0)[0]

    def pump(self, ctrl: socket.socket, request: bytes = b"", stop_at_result: bool = False) -> str:
        """Forward output and collect results until "exit", "result" or "kill" (returned).

        ``request`` is written to the child's request pipe as it can take it.
        """
        sel = selectors.DefaultSelector()
        for name in ("o", "e", "r"):
            if name in self.pipes:
                sel.register(self.pipes[name], selectors.EVENT_READ, name)
        sel.register(self.pidfd, selectors.EVENT_READ, "exit")
        sel.register(ctrl, selectors.EVENT_READ, "ctrl")
        pending = memoryview(request)
        if pending:
            sel.register(self.pipes["q"], selectors.EVENT_WRITE, "q")
        try:
            while True:
                for key, _ in sel.select():
                    if key.data == "exit":
                        return "exit"
                    if key.data == "ctrl" and _kill_asked(ctrl):
                        return "kill"
                    if key.data == "q":
                        pending = pending[_write(key.fd, pending) :]
                        if not pending:
                            sel.unregister(key.fd)
                    elif key.data in ("o", "e", "r") and not self._read(key, sel, ctrl):
                        continue
                    if stop_at_result and self.results:
                        return "result"
        finally:
            sel.close()

    def _read(self, key, sel, ctrl) -> bool:
        try:
            data = os.read(key.fd, 1 << 16)
        except BlockingIOError:
            return False
        if not data:
            sel.unregister(key.fd)
            return False
        self._take(key.data, data, ctrl)
        return True

    def _take(self, name: str, data: bytes, ctrl: socket.socket) -> None:
        if name != "r":
            wire.send(ctrl, {"kind": "out", "stream": name}, data)
            return
        try:
            self.results += self.reader.feed(data)
        except wire.FrameError:
            self.garbled = True

    def drain(self, ctrl: socket.socket) -> None:
        """The child and its offspring are dead: read what is left in its pipes."""
        for name in ("o", "e", "r"):
            fd = self.pipes.get(name)
            while fd is not None:
                try:
                    data = os.read(fd, 1 << 16)
                except BlockingIOError:
                    break
                if not data:
                    break
                self._take(name, data, ctrl)

    def result(self, who: str) -> tuple[dict, bytes]:
        """The next result frame, or an error frame saying that none came."""
        if self.results and self.results[0][0].get("kind") == "result" and not self.garbled:
            return self.results.pop(0)
        self.results.clear()
        return {
            "kind": "result",
            "ok": False,
            "type": "RuntimeError",
            "summary": f"{who} ended without a result",
            "traceback": "",
        }, b""

    def close(self) -> None:
        for fd in [*self.pipes.values(), self.pidfd]:
            try:
                os.close(fd)
            except OSError:
                pass
        self.pipes = {}


def _write(fd: int, data: memoryview) -> int:
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0
    except BrokenPipeError:  # the child died: its exit says so
        return len(data)


def _kill_asked(ctrl: socket.socket) -> bool:
    """A control frame during a job: only "kill" (or the grader gone) stops it."""
    frame = wire.recv_blocking(ctrl)
    if frame is None:
        end_processes()
        os._exit(0)
    return frame[0]["kind"] == "kill"


def fork(target, *args, requests: bool = False, keep_fds=()) -> Child:
    """Fork ``target(fds, *args)``: fd 1 and 2 are its out and err pipes, fds["r"] its
    result pipe, fds["q"] its request socket when ``requests`` (a socket, so that a
    descriptor can follow: a rank's relay); of the slot's descriptors it keeps
    ``keep_fds`` only. The child exits after ``target``."""
    ours, theirs = {}, {}
    for name in "oer":
        r, w = os.pipe()
        ours[name], theirs[name] = r, w
    if requests:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours["q"], theirs["q"] = a.detach(), b.detach()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the slot (init) ignores it
        os.dup2(theirs.pop("o"), 1)
        os.dup2(theirs.pop("e"), 2)
        _close_all_but({0, 1, 2, *theirs.values(), *keep_fds})
        try:
            target(theirs, *args)
        finally:
            os._exit(0)
    for fd in theirs.values():
        os.close(fd)
    for fd in ours.values():
        os.set_blocking(fd, False)
    return Child(pid, ours)


def _close_all_but(keep: set[int]) -> None:
    """Close every descriptor but ``keep``: the slot's control socket above all."""
    for fd in sorted({int(f) for f in os.listdir("/proc/self/fd")} - keep):
        try:
            os.close(fd)
        except OSError:
            pass


def _others(keep: set[int]) -> list[int]:
    """Processes of the sandbox but init, us and ``keep`` that are alive or that we must
    still reap (a zombie of a kept parent is dead already: that parent reaps it)."""
    me = os.getpid()
    skip = keep | {1, me}
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) in skip:
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
        except (OSError, IndexError, ValueError):
            continue
        if state not in ("Z", "X") or int(ppid) == me:
            out.append(int(p))
    return out


def _reap(codes: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        codes[pid] = os.waitstatus_to_exitcode(status)


def _signal_all(sig: int) -> None:
    try:
        os.kill(-1, sig)  # every process we may signal in this PID namespace, but us and init
    except OSError:
        pass


def end_processes(keep: frozenset[int] | set[int] = frozenset(), wait: float = 5.0) -> dict:
    """Kill every process of the sandbox but the slot and ``keep``; the exit codes reaped.

    With nothing to keep, one ``kill(-1, SIGKILL)`` reaches them all at once (no fork
    escapes it). Otherwise all are stopped first (``kill(-1, SIGSTOP)``), the others killed
    by their pid, and the kept ones continued.
    """
    codes: dict[int, int] = {}
    keep = set(keep)
    _signal_all(signal.SIGSTOP if keep else signal.SIGKILL)
    end = time.monotonic() + wait
    while True:
        for pid in _others(keep):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _reap(codes)
        if not _others(keep) or time.monotonic() > end:
            break
        time.sleep(0.002)
    for pid in keep:
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass
    return codes


def wipe(dirs) -> None:
    """Empty each directory (nothing a job wrote reaches the next job)."""
    for d in dirs:
        try:
            entries = os.listdir(d)
        except OSError:
            continue
        for name in entries:
            path = os.path.join(d, name)
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.unlink(path)
            except OSError:
                pass
