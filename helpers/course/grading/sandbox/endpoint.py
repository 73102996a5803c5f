"""The grader's end of one sandbox slot: its bwrap process, control socket and log.

``launch`` starts the sandbox (helpers.course.grading.sandbox.bwrap around ``python -m
helpers.course.grading.sandbox.slot``, its control socket on stdin), ``await_ready`` waits until it imported torch,
``send`` writes a frame (and, for a rank, passes its relay socket), ``stop`` ends it: a
closed control socket makes the slot end its processes and exit, and bwrap's
``--die-with-parent`` takes the whole sandbox along if the grader itself dies.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from helpers.course.grading.sandbox import bwrap, wire

__all__ = ["SLOT_MODULE", "Slot"]

SLOT_MODULE = "helpers.course.grading.sandbox.slot"
VALUE_BYTES = 1 << 30  # the largest frame a sandbox may send: a value, an output chunk


class Slot:
    """The grader's end of one sandbox slot: its process, control socket and log."""

    scratch = Path(bwrap.SCRATCH)  # its working directory, inside (a fresh tmpfs per job)

    def __init__(self, index: int, root: Path, hide: Sequence[Path]):
        self.index, self.root, self.hide = index, root, list(hide)
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.reader = wire.Reader(VALUE_BYTES)
        self.ready = False
        self.start_s: float | None = None  # seconds from launch to "ready"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.sock is not None

    def launch(self) -> None:
        self.stop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # its control socket is its stdin: no descriptor number in its command line, which
        # a learner reads in /proc/1/cmdline (the same in autograde and Validate)
        argv = [sys.executable, "-m", SLOT_MODULE]
        cmd = bwrap.command(argv, hide=self.hide)
        log = open(self.root / f"slot{self.index}.log", "wb")  # the slot's own stderr
        self._t0 = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=theirs.fileno(),
                stdout=log,
                stderr=log,
                env=bwrap.launch_environment(),
                start_new_session=True,
            )
        finally:
            theirs.close()
            log.close()
        self.sock, self.reader, self.ready = ours, wire.Reader(VALUE_BYTES), False

    def await_ready(self, deadline: float) -> None:
        while not self.ready:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                data = b""
            frames = self.reader.feed(data) if data else []
            if any(h["kind"] == "ready" for h, _ in frames):
                self.ready, self.start_s = True, time.monotonic() - self._t0
            elif not data:
                log = self.log_tail()
                self.stop()
                raise bwrap.SandboxUnavailable(
                    f"sandbox slot {self.index} did not start (bwrap, then python -m "
                    f"{SLOT_MODULE}):\n{log}"
                )
        self.sock.settimeout(None)
        self.sock.setblocking(False)

    def log_tail(self) -> str:
        try:
            return (self.root / f"slot{self.index}.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def send(self, header: dict, blob: bytes = b"", fd: int | None = None) -> None:
        self.sock.setblocking(True)
        try:
            wire.send(self.sock, header, blob)
            if fd is not None:
                socket.send_fds(self.sock, [b"F"], [fd])
        finally:
            self.sock.setblocking(False)

    def hang_up(self) -> None:
        """Close the control socket: the slot ends its processes and exits."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.ready = False

    def stop(self, wait: float = 2.0) -> None:
        self.hang_up()
        proc, self.proc = self.proc, None
        if proc is not None:
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                proc.kill()  # bwrap --die-with-parent takes the sandbox with it
                proc.wait()
