"""Inside a sandbox: the body of a forked rank, and of the learner process for direct calls.

A rank (``run_rank``, forked ahead of its job and waiting in ``wait_for_job``) first makes
its own namespaces and drops every capability (``jail.enter``: the lab's refused modules
absent, fresh /tmp and /scratch, its own IPC), then builds the learner's namespace,
unpickles the test's function and
arguments (the grader's ``LearnerRef``s become the learner's objects), joins the relay
process group on the socket it was given (``relay.backend.connect``: every message goes
through the grader, which records it), runs ``fn(d, *args)`` and writes its value as data
(``learner.as_data``) or its error as text, as one frame on its result pipe.

The learner process (``serve_calls``) builds the namespace once and answers direct calls
(``shard_range(146, 1, 4)`` in a test) one at a time, in the same way, for as long as the
grader's learner source stays the same.
"""

from __future__ import annotations

import os
import sys

from helpers.course.grading.sandbox import jail, learner, wire

__all__ = ["run_rank", "serve_calls", "wait_for_job"]


def _become(threads: int, env: dict[str, str]) -> None:
    """Line-buffered text streams on the pipes, the rank's variables, its thread count."""
    import torch

    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    os.environ.update(env)
    torch.set_num_threads(threads)


def _write_frame(fd: int, header: dict, blob: bytes = b"") -> None:
    data = memoryview(wire.encode(header, blob))
    while data:
        data = data[os.write(fd, data) :]


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream says nothing more
            pass


def _join(rank: int, world_size: int, relay_fd: int | None, strict: bool = False):
    """The rank's Dist: the relay group when the grader gave a socket, else no group.
    ``strict``: on the stand-in GPU, its group refusing host tensors as NCCL does."""
    import torch

    from helpers.dist import Dist

    if relay_fd is None:
        return Dist(rank=rank, local_rank=rank, world_size=world_size, backend="none")
    from helpers.course.grading.relay.backend import connect

    device = torch.device("cpu")
    if strict:
        from helpers import standin

        os.environ[standin.MODE_ENV] = "strict"
        standin.install()
        device = standin.device()
    connect(relay_fd, rank, world_size, strict=strict)
    return Dist(rank=rank, local_rank=rank, world_size=world_size, device=device, backend="relay")


def _leave(failed: bool) -> None:
    import torch.distributed as tdist

    from helpers import dist

    if tdist.is_available() and tdist.is_initialized():
        dist.cleanup(failed=failed)


def run_rank(fds: dict[str, int], job: dict, request: dict, relay_fd: int | None) -> None:
    """One rank of a job (see the module docstring); exits the process when done."""
    rank, world = job["rank"], job["world_size"]
    header, blob, status = {}, b"", 1
    try:
        jail.enter(job.get("jail") or {})  # its own namespaces; no capability from here on
        _become(
            job["threads"],
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(world),
            },
        )
        import cloudpickle

        learner.build_namespace(request["learner_source"], request["programs"])
        fn, args = cloudpickle.loads(request["payload"])
        d = _join(rank, world, relay_fd, job.get("device_check") == "strict")
        try:
            value = fn(d, *args)
        except BaseException:
            _leave(failed=True)
            raise
        _leave(failed=False)
        header, blob, status = (
            {"kind": "result", "ok": True},
            learner.as_data(value, f"rank {rank}"),
            0,
        )
    except BaseException as e:  # noqa: BLE001 - every failure is reported to the grader
        header = {"kind": "result", "ok": False, **learner.error_report(e, __file__)}
    finally:
        _flush()
        try:
            _write_frame(fds["r"], header, blob)
        finally:
            os._exit(status)


def wait_for_job(fds: dict[str, int]) -> None:
    """A rank forked ahead of its job (the fork is off the job's path): wait for the job on
    the request socket, with the relay socket after it when the job has a group."""
    import pickle
    import socket

    sock = socket.socket(fileno=fds["q"])
    frame = wire.recv_blocking(sock)
    if frame is None:  # the slot went away
        os._exit(0)
    job, blob = frame
    relay = None
    if job.get("group"):
        _, passed, _, _ = socket.recv_fds(sock, 1, 1)
        relay = passed[0] if passed else None
    sock.close()
    run_rank(fds, job, pickle.loads(blob), relay)


def _read_request(fd: int):
    """The next call request from the slot: (name, args, kwargs), or None at EOF."""
    reader, frames = wire.Reader(), []
    while not frames:
        data = os.read(fd, 1 << 16)
        if not data:
            return None
        frames = reader.feed(data)
    import cloudpickle

    header, blob = frames[0]
    args, kwargs = cloudpickle.loads(blob)  # from the grader: the trusted direction
    return header["name"], args, kwargs


def _answer(name: str, args, kwargs):
    obj = learner.proxies().lookup(name)
    if callable(obj):
        return obj(*args, **kwargs)
    if args or kwargs:
        raise TypeError(f"{name} is a {type(obj).__name__}, not a function: it takes no arguments")
    return obj


def serve_calls(fds: dict[str, int], request: dict, threads: int) -> None:
    """The learner process: build the namespace, then answer calls until the slot closes."""
    built: BaseException | None = None
    try:
        jail.enter(request.get("jail") or {})  # its own namespaces; no capability from here on
        _become(threads, {})
        learner.build_namespace(request["learner_source"], request["programs"])
    except BaseException as e:  # noqa: BLE001 - every call reports it
        built = e
    while True:
        req = _read_request(fds["q"])
        if req is None:
            os._exit(0)
        name, args, kwargs = req
        try:
            if built is not None:
                raise built
            value = learner.as_data(_answer(name, args, kwargs), f"{name}(...)")
            header, blob = {"kind": "result", "ok": True}, value
        except BaseException as e:  # noqa: BLE001 - reported to the grader
            header, blob = {"kind": "result", "ok": False, **learner.error_report(e, __file__)}, b""
        _flush()
        _write_frame(fds["r"], header, blob)
