"""The zygote: a process that imported torch once and forks one worker per rank on request.

Started by helpers.launch.pool as ``python -m helpers.launch.zygote`` (a fresh interpreter, so
it never imports the caller's ``__main__``). Protocol, on the zygote's stdin and
stdout, each message a 4-byte length and a pickle:

    parent -> zygote   {"spawn": request}   fork request["world_size"] workers
                       {"kill": True}       SIGKILL the current workers
                       EOF                  kill the workers and exit
    zygote -> parent   {"ready": pid}       torch is imported
                       {"pids": [...]}      the workers started
                       {"exit": rank, "code": c, "job": j}   a worker of
                                            request j ended (c < 0: signal)

Each worker connects three times to the parent's Unix socket (stdout, stderr,
result), joins the gloo group with helpers.dist.init(), calls fn(d, *args) and
sends back ("ok", value) or ("err", traceback, exception, summary). The group's
rendezvous store is served by rank 0 on a socket the zygote opened (and was
already listening on) before it forked the ranks.

Forking is safe because the zygote never runs a torch operation, so no OpenMP or
intra-op thread pool exists yet; each worker sets its own thread count.
"""

from __future__ import annotations

import gc
import linecache
import os
import pickle
import selectors
import signal
import socket
import sys
import traceback

from helpers.launch.framing import recv, send

# --------------------------------------------------------------------------- zygote side


def _die_with_zygote(zygote: int) -> None:
    if sys.platform.startswith("linux"):  # die with the zygote, never linger
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != zygote:  # it died before prctl took effect
            os._exit(1)


def _wire_output(rank: int, sock_path: str) -> dict:
    """Connect the three sockets (stdout, stderr, result); fd 1 and 2 become the first two.

    Replacing the file descriptors (not just sys.stdout) forwards C++ output too:
    gloo's messages and torch's warnings.
    """
    socks = {}
    for kind in "oer":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock_path)
        s.sendall(f"{kind}{rank:07d}".encode())
        socks[kind] = s
    os.dup2(socks["o"].fileno(), 1)
    os.dup2(socks["e"].fileno(), 2)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    return socks


def _become_rank(rank: int, req: dict) -> None:
    """The caller's directory, environment and sys.path, plus torchrun's rank variables."""
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    n = req["world_size"]
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(n),
        LOCAL_WORLD_SIZE=str(n),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(req["port"]),
        OMP_NUM_THREADS=str(req["threads"]),
    )
    sys.path[:] = req["path"]
    linecache.cache.update(req["sources"])


def store_for_rank(rank: int, world_size: int, port: int, fd: int, timeout: float):
    """The rendezvous store: rank 0 serves it on ``fd``, a socket the zygote opened and was
    listening on before it forked the ranks; the others close their copy and connect.

    Every rank connects at its first try. With env:// (rank 0 opens the port itself) the
    others often came first, were refused and waited out torch's client back-off: 0.3-0.8 s
    in 6 of 40 4-rank spawns measured, several times a small spawn's whole cost.
    """
    import datetime

    import torch.distributed as tdist

    if rank != 0:
        os.close(fd)
    return tdist.TCPStore(
        "127.0.0.1",
        port,
        world_size,
        is_master=rank == 0,
        timeout=datetime.timedelta(seconds=timeout),
        master_listen_fd=fd if rank == 0 else None,
    )


def _call(req: dict):
    """Join the group, run fn(d, *args), leave the group; fn's return value."""
    import cloudpickle
    import torch

    from helpers import dist

    torch.set_num_threads(req["threads"])
    fn, args = cloudpickle.loads(req["payload"])
    rank, world, timeout = int(os.environ["RANK"]), req["world_size"], req["timeout"]
    store = store_for_rank(rank, world, req["port"], req["listen_fd"], timeout)
    d = dist.init(backend=req["backend"], timeout_s=timeout, store=store)
    value = fn(d, *args)
    # cleanup() waits for every rank first: rank 0 hosts the rendezvous store.
    dist.cleanup()
    return cloudpickle.dumps(value)


def _error_report(e: BaseException) -> tuple:
    """("err", traceback without this file's frames, pickled exception or None, summary)."""
    te = traceback.TracebackException.from_exception(e)
    te.stack = traceback.StackSummary.from_list(
        [f for f in te.stack if f.filename != __file__] or te.stack
    )
    try:
        import cloudpickle

        exc = cloudpickle.dumps(e)
    except Exception:  # an exception that cannot travel still has its text
        exc = None
    return ("err", "".join(te.format()), exc, f"{type(e).__name__}: {e}")


def _worker(rank: int, req: dict, ctrl: tuple[int, int]) -> None:
    """Body of one forked rank: wire up output, join the group, run fn, report."""
    zygote = os.getppid()
    for fd in ctrl:
        os.close(fd)  # the zygote's control pipes are not ours
    os.setpgid(0, 0)  # our own process group: a kill also reaches processes we start
    status, result, socks = 1, None, {}
    try:
        _die_with_zygote(zygote)
        socks = _wire_output(rank, req["sock"])
        _become_rank(rank, req)
        result, status = ("ok", _call(req)), 0
    except BaseException as e:  # noqa: BLE001 - every failure is reported to the parent
        result = _error_report(e)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            socks["r"].sendall(pickle.dumps(result))
        except BaseException:  # noqa: BLE001 - the parent notices the missing result
            pass
        os._exit(status)  # skip interpreter teardown: it is the zygote's, not ours


def rendezvous_socket() -> socket.socket:
    """A socket listening on a free local port, for one spawn's rendezvous store."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    return listener


def _kill(live: dict) -> None:
    for pid in live:  # each worker leads its own process group
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
                break
            except (ProcessLookupError, PermissionError):
                continue


def _fork_ranks(req: dict, ctrl: tuple[int, int], live: dict) -> None:
    """Fork one worker per rank (added to ``live``), after opening their rendezvous socket."""
    listener = rendezvous_socket()
    req.update(port=listener.getsockname()[1], listen_fd=listener.fileno())
    for rank in range(req["world_size"]):
        pid = os.fork()
        if pid == 0:
            _worker(rank, req, ctrl)
        live[pid] = (req.get("job", 0), rank)
    listener.close()  # rank 0 serves on its copy; the zygote keeps none


def serve() -> None:
    """The zygote loop: preload torch, then fork workers on request until stdin closes."""
    # Keep the control pipes off fd 0/1 so forked workers cannot write into them.
    ctrl_in, ctrl_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)  # a stray print in the zygote goes to stderr, not into the protocol

    import cloudpickle  # noqa: F401  (preloaded for the workers)
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  (torch.optim optimizers import it lazily: ~2 s per rank)
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401  (DistributedDataParallel)
    import torch.optim  # noqa: F401

    import helpers.dist  # noqa: F401

    # Move everything imported so far out of the garbage collector's sight. Each rank
    # calls gc.collect() in dist.cleanup(); without this it would walk the whole
    # preloaded torch heap (~0.2 s per rank, and 4 ranks share 2 cores).
    gc.collect()
    gc.freeze()
    send(ctrl_out, {"ready": os.getpid()})
    live: dict[int, tuple[int, int]] = {}  # pid -> (request number, rank)
    while True:
        ready = selectors.DefaultSelector()
        ready.register(ctrl_in, selectors.EVENT_READ)
        if ready.select(0.02 if live else None):
            msg = recv(ctrl_in)
            if msg is None or "kill" in msg:
                _kill(live)
                if msg is None:  # the parent went away
                    return
            elif "spawn" in msg:
                _fork_ranks(msg["spawn"], (ctrl_in, ctrl_out), live)
                send(ctrl_out, {"pids": list(live)})
        ready.close()
        while live:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            job = live.pop(pid, None)
            if job is not None:
                code = os.waitstatus_to_exitcode(status)
                send(ctrl_out, {"exit": job[1], "code": code, "job": job[0]})


if __name__ == "__main__":
    serve()
