"""A sandbox slot: a python that imported torch once, inside bwrap, and forks the learner's work.

Started by the grader's SandboxPool as ``python -m helpers.course.grading.sandbox.slot``
inside a sandbox (helpers.course.grading.sandbox.bwrap), its control socket on stdin. It never
runs learner code itself: each job is a forked child, so what one notebook's code did to
a process never reaches the next notebook's. Forking is safe because the slot runs no
torch operation (no OpenMP pool exists yet), as helpers.launch.zygote explains.

Control messages (helpers.course.grading.sandbox.wire frames):

    grader -> slot  {"kind": "job", "rank", "world_size", "threads", "group"} + a pickle
                    (payload, learner_source, programs), then, when "group" is true, one
                    byte carrying the rank's relay socket (SCM_RIGHTS)
                    {"kind": "call", "name", "source_id", "threads"} + a pickle (args:
                    cloudpickled args and kwargs, learner_source, programs): a direct call
                    in the learner process, which lives while source_id stays the same
                    {"kind": "kill"}: end the running job or call now
                    {"kind": "end"}: end the learner process (the notebook is graded)
    slot -> grader  {"kind": "ready"}; {"kind": "out", "stream": "o" | "e"} + bytes;
                    {"kind": "result", "ok": true} + torch.save bytes, or
                    {"kind": "result", "ok": false, "type", "summary", "traceback"};
                    {"kind": "done", "code": the rank's exit code or null}: every process
                    the job started is gone, and scratch, /tmp and /dev/shm are empty

The slot is its PID namespace's init (bwrap --as-pid-1) and is not dumpable: a rank (same
uid, no capability) can neither signal it nor ptrace it nor read its descriptors. It keeps
CAP_SYS_ADMIN in its own user namespace, for the mounts of each job's namespaces
(helpers.course.grading.sandbox.jail), which every child drops before any learner code.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import os
import pickle
import signal
import socket
import sys

from helpers.course.grading.sandbox import wire
from helpers.course.grading.sandbox.children import Child, end_processes, fork, wipe

PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36
# Imported once here, so no rank pays for them (the labs' imports cells name these).
PRELOAD = (
    "torch",
    "torch._dynamo",
    "torch.distributed",
    "torch.nn.parallel",
    "torch.optim",
    "torch.distributed.device_mesh",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
    "torch.distributed.tensor.parallel",
    "torch.nn.functional",
    "cloudpickle",
    "numpy",
    "helpers.dist",
    "helpers.compat",
    "helpers.launch",
    "helpers.models",
    "helpers.course.grading.recorder.traffic",
    "helpers.course.grading.recorder.allocations",
    "helpers.course.grading.relay.backend",
    "helpers.course.grading.sandbox.rank",
)
WRITABLE = ("/tmp", "/dev/shm")


def _light_grader_package() -> None:
    """Let ``helpers.course.grading.grader.proxies`` (where the grader's LearnerRefs resolve)
    import without its package's ``__init__``, which loads nbgrader for the grader's
    preprocessor: 2.3 s of CPU and 70 MB in every slot, for nothing a sandbox uses."""
    import types

    import helpers.course.grading as grading

    name = "helpers.course.grading.grader"
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(os.path.dirname(grading.__file__), "grader")]
        sys.modules[name] = package


def _preload() -> None:
    _light_grader_package()
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # the relay is optional to a test of the sandbox alone
            pass
    gc.collect()
    gc.freeze()  # each rank's gc.collect() then skips the preloaded heap


def _finish(ctrl: socket.socket, child: Child, who: str, keep=frozenset()) -> None:
    """End every other process, forward what is left, the result, then "done"."""
    codes = end_processes(keep)
    child.drain(ctrl)
    header, blob = child.result(who)
    wire.send(ctrl, header, blob)
    if not keep:
        wipe([os.getcwd(), *WRITABLE])
    wire.send(ctrl, {"kind": "done", "code": codes.get(child.pid)})


class Ranks:
    """The next rank of this slot, forked ahead (a fork of this large process takes
    30-70 ms; done between jobs, it is off the job's path)."""

    def __init__(self) -> None:
        self.spare: Child | None = None

    def prefork(self) -> None:
        """Fork the spare rank, unless a live one waits (a direct call's clean-up in this
        slot kills it: it is then forked again)."""
        from helpers.course.grading.sandbox.rank import wait_for_job

        if self.spare is not None and not self.spare.alive():
            self.spare.close()
            self.spare = None
        if self.spare is None:
            # the rank starts from the memory the slot uses, not its free heap (the grader's
            # memory samples count from there: helpers.course.grading.relay.probes)
            ctypes.CDLL(None).malloc_trim(0)
            self.spare = fork(wait_for_job, requests=True)

    def run(self, ctrl: socket.socket, header: dict, blob: bytes) -> None:
        relay = None
        if header.get("group"):
            _, fds, _, _ = socket.recv_fds(ctrl, 1, 1)
            relay = fds[0] if fds else None
        self.prefork()
        child, self.spare = self.spare, None
        q = socket.socket(fileno=child.pipes.pop("q"))
        q.setblocking(True)
        try:
            q.sendall(wire.encode(header, blob))
            if relay is not None:
                socket.send_fds(q, [b"F"], [relay])
        except OSError:  # the child is gone: its exit says so
            pass
        finally:
            q.close()
            if relay is not None:
                os.close(relay)
        child.pump(ctrl)
        _finish(ctrl, child, f"rank {header['rank']}")
        child.close()


class Learner:
    """The learner process of this slot (direct calls), kept while its source is the same."""

    def __init__(self) -> None:
        self.child: Child | None = None

    def end(self) -> None:
        if self.child is not None:
            end_processes()
            self.child.close()
            self.child = None
            wipe([os.getcwd(), *WRITABLE])

    def call(self, ctrl: socket.socket, header: dict, request: dict) -> None:
        from helpers.course.grading.sandbox.rank import serve_calls

        if self.child is not None and self.child.tag != header["source_id"]:
            self.end()
        if self.child is None:
            self.child = fork(serve_calls, request, header["threads"], requests=True)
            self.child.tag = header["source_id"]
        ask = wire.encode({"kind": "call", "name": header["name"]}, request["args"])
        how = self.child.pump(ctrl, ask, stop_at_result=True)
        if how == "result":
            _finish(ctrl, self.child, f"the call of {header['name']}", keep={self.child.pid})
            return
        _finish(ctrl, self.child, f"the learner process (calling {header['name']})")
        self.child.close()
        self.child = None


def serve(stdin: int = 0) -> None:
    """The slot's loop: jobs and calls, one at a time, until the grader closes the socket
    (its stdin, moved off fd 0)."""
    ctrl_fd = os.dup(stdin)
    ctrl = socket.socket(fileno=ctrl_fd)
    os.set_inheritable(ctrl_fd, False)
    libc = ctypes.CDLL(None)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # init: nothing inside may stop it
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]  # scratch is no import root
    _preload()
    learner, ranks = Learner(), Ranks()
    ranks.prefork()
    wire.send(ctrl, {"kind": "ready", "pid": os.getpid()})
    while True:
        frame = wire.recv_blocking(ctrl)
        if frame is None:
            end_processes()
            return
        header, blob = frame
        if header["kind"] == "job":
            learner.end()
            ranks.run(ctrl, header, blob)
            ranks.prefork()
        elif header["kind"] == "call":
            learner.call(ctrl, header, pickle.loads(blob))
        elif header["kind"] == "end":  # the notebook is graded: its learner process goes
            learner.end()
            wire.send(ctrl, {"kind": "done", "code": None})


if __name__ == "__main__":
    serve()
