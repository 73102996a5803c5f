"""Collectives by hand: a ring all-reduce and a parameter server, and timing them.

Both functions take the caller's ``Dist`` (from ``helpers.dist.init()`` or
``helpers.launch.spawn``) and a tensor, and leave the element-wise sum over
ranks in every rank's tensor, like ``torch.distributed.all_reduce``.

Ring all-reduce (seed 002) on N ranks = reduce-scatter, then all-gather::

    the flat tensor is cut into N chunks c0..c(N-1) (torch.tensor_split, so
    any length works; chunks differ by at most one element, some may be empty)

    reduce-scatter, step s = 0..N-2:
        rank r sends chunk (r - s) % N to rank r+1,
        receives chunk (r - s - 1) % N from rank r-1 and adds it to its own.
        After N-1 steps rank r holds the full sum of chunk (r + 1) % N.
    all-gather, step s = 0..N-2:
        rank r sends chunk (r + 1 - s) % N (complete) to rank r+1,
        receives chunk (r - s) % N from rank r-1 and overwrites its own.

Every step moves n/N bytes on every link at once; 2(N-1) steps in all, which is
the cost model of ``helpers.parallel.collectives.costmodel``.

In each step a rank posts its send to the right and its receive from the left as ONE
batch (``batch_isend_irecv``), so they run together, as the cost model assumes. Two
separate calls would hang on GPUs: NCCL runs a rank's operations in a group in the order it
posted them (sends and receives on one stream, since ``helpers.dist.init`` binds the group
to its GPU), and a send completes only when the matching receive runs; an ``isend`` then a
``recv`` on every rank queues each receive behind its own rank's send, which waits for its
neighbour's receive, round the ring. Gloo lets the ``isend`` go out first, so on CPU ranks
both pass (notebook 02 shows the hang on the stand-in GPU, ``helpers.standin``).
The parameter server and the ping-pong pair each send with the receive the peer has
already posted (one side sends while the other receives), which NCCL completes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as tdist

from helpers.dist import Dist, synchronize

__all__ = [
    "chunk_bounds",
    "ring_all_reduce",
    "ps_all_reduce",
    "builtin_all_reduce",
    "ALL_REDUCES",
    "demo_collectives",
    "ring_trace",
    "time_all_reduce",
    "measure",
    "pingpong",
]


def chunk_bounds(numel: int, world: int) -> list[tuple[int, int]]:
    """(start, stop) of each rank's chunk, as torch.tensor_split cuts ``numel`` elements."""
    base, extra = divmod(numel, world)
    bounds, start = [], 0
    for i in range(world):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """A 1-D view when possible (so chunk edits land in ``tensor``), else a copy."""
    return tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1).clone()


def _exchange(send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
    """Send one chunk to ``dst`` while receiving one from ``src``: ONE batch, then wait.

    A batch posts both together, and NCCL runs them together, in any order; posted as two
    calls (``isend``, then ``recv``) they hang on GPUs: each rank's receive waits behind its
    own send, which waits for its neighbour's receive (module docstring). Both ends compute chunk sizes from the same numel, so they agree on which
    chunks are empty and leave them out.
    """
    ops = [tdist.P2POp(tdist.isend, send, dst)] if send.numel() else []
    ops += [tdist.P2POp(tdist.irecv, recv, src)] if recv.numel() else []
    for req in tdist.batch_isend_irecv(ops) if ops else []:
        req.wait()


def _record(trace: list | None, phase: str, step: int, sent, received, flat) -> None:
    if trace is not None:  # a copy: flat keeps changing in later steps
        trace.append(dict(phase=phase, step=step, sent=sent, received=received, state=flat.clone()))


def ring_all_reduce(
    d: Dist,
    tensor: torch.Tensor,
    *,
    average: bool = False,
    inplace: bool = True,
    trace: list | None = None,
) -> torch.Tensor:
    """Sum ``tensor`` over all ranks with a ring (reduce-scatter + all-gather).

    average: divide by the number of ranks (gradient averaging).
    inplace: False leaves ``tensor`` untouched and returns a new tensor.
    trace: a list to append one record per step to (for the notebook's
        step-by-step figure): dict(phase, step, sent, received, state) where
        sent/received are chunk indices and state is a copy of this rank's buffer.
    """
    out = tensor if inplace else tensor.clone()
    n, r = d.world_size, d.rank
    flat = _flat(out)  # (numel,)
    chunks = torch.tensor_split(flat, n)  # N views into flat
    right, left = (r + 1) % n, (r - 1) % n
    _record(trace, "start", 0, None, None, flat)

    for s in range(n - 1):  # reduce-scatter
        send_i, recv_i = (r - s) % n, (r - s - 1) % n
        incoming = torch.empty_like(chunks[recv_i])  # (chunk_len,)
        _exchange(chunks[send_i], right, incoming, left)
        chunks[recv_i].add_(incoming)
        _record(trace, "reduce-scatter", s + 1, send_i, recv_i, flat)

    for s in range(n - 1):  # all-gather: pass the finished chunks around
        send_i, recv_i = (r + 1 - s) % n, (r - s) % n
        _exchange(chunks[send_i], right, chunks[recv_i], left)
        _record(trace, "all-gather", s + 1, send_i, recv_i, flat)

    if average:
        flat.div_(n)
    if flat.data_ptr() != out.data_ptr():  # non-contiguous input: copy the result back
        out.copy_(flat.view_as(out))
    return out


def ps_all_reduce(
    d: Dist, tensor: torch.Tensor, *, server: int = 0, average: bool = False
) -> torch.Tensor:
    """All-reduce through one parameter server, in place, with send/recv.

    Workers send their whole tensor to ``server``; it adds them up (in rank
    order, so the result is deterministic) and sends the sum back to each.
    The server moves (N-1)*n bytes in and (N-1)*n out; a worker only n each way.
    """
    if d.rank == server:
        incoming = torch.empty_like(tensor)
        for src in range(d.world_size):
            if src != server:
                tdist.recv(incoming, src)
                tensor.add_(incoming)
        if average:
            tensor.div_(d.world_size)
        for dst in range(d.world_size):
            if dst != server:
                tdist.send(tensor, dst)
    else:
        tdist.send(tensor, server)
        tdist.recv(tensor, server)
    return tensor


def builtin_all_reduce(d: Dist, tensor: torch.Tensor) -> torch.Tensor:
    """torch.distributed.all_reduce (gloo here, NCCL on GPUs), for comparison."""
    tdist.all_reduce(tensor)
    return tensor


ALL_REDUCES: dict[str, Callable[[Dist, torch.Tensor], torch.Tensor]] = {
    "ring": ring_all_reduce,
    "ps": ps_all_reduce,
    "builtin": builtin_all_reduce,
}


# --------------------------------------------------------------------- notebook demos


def demo_collectives(d: Dist, n: int | None = None) -> dict[str, tuple[list, list]]:
    """Run the five classic collectives on small tensors; (before, after) per collective.

    Rank r starts with ``10 * r + [0, 1, ..., n-1]`` so every number says where
    it came from. n defaults to 2 * world_size (reduce-scatter then gives 2 each).
    """
    n = n or 2 * d.world_size
    # on the rank's device: NCCL takes only GPU tensors (gloo, on the CPU, takes both)
    start = torch.arange(n, dtype=torch.float32, device=d.device) + 10 * d.rank  # (n,)
    out: dict[str, tuple[list, list]] = {}

    x = start.clone()
    tdist.broadcast(x, src=0)
    out["broadcast"] = (start.tolist(), x.tolist())

    x = start.clone()
    tdist.reduce(x, dst=0)  # only rank 0's result is defined; others hold scratch
    out["reduce"] = (start.tolist(), x.tolist())

    x = start.clone()
    tdist.all_reduce(x)
    out["all_reduce"] = (start.tolist(), x.tolist())

    parts = [torch.empty_like(start) for _ in range(d.world_size)]
    tdist.all_gather(parts, start)
    out["all_gather"] = (start.tolist(), torch.cat(parts).tolist())

    mine = torch.empty_like(torch.tensor_split(start, d.world_size)[d.rank])
    tdist.reduce_scatter(mine, list(torch.tensor_split(start.clone(), d.world_size)))
    out["reduce_scatter"] = (start.tolist(), mine.tolist())
    return out


def ring_trace(d: Dist, elems_per_chunk: int = 1) -> dict:
    """The ring all-reduce step by step on a tiny tensor, checked against all_reduce.

    Rank r starts with 2**r everywhere, so a value read in binary names the
    ranks already summed into it (15 = 0b1111 = all four of four ranks).
    """
    x = torch.full((d.world_size * elems_per_chunk,), float(2**d.rank), device=d.device)
    expected = x.clone()
    tdist.all_reduce(expected)
    trace: list = []
    ring_all_reduce(d, x, trace=trace)
    for t in trace:
        t["state"] = t["state"].tolist()
    return {"trace": trace, "equal": bool(torch.equal(x, expected)), "result": x.tolist()}


# --------------------------------------------------------------------- timing


def _slowest_times(d: Dist, fn, buf: torch.Tensor, src: torch.Tensor, repeats: int, warmup: int):
    """Seconds of each timed repeat of ``fn(d, buf)``, slowest rank per repeat (on every rank).

    On a GPU a collective is queued, not done, when the call returns: the clock is read
    only after ``synchronize`` waits for the device. The warm-up repeats (communicators
    set up, buffers allocated) are left out.
    """
    times = []
    for _ in range(warmup + repeats):
        buf.copy_(src)
        synchronize(d.device)
        tdist.barrier()
        t0 = time.perf_counter()
        fn(d, buf)
        synchronize(d.device)
        times.append(time.perf_counter() - t0)
    slowest = torch.tensor(times[warmup:], dtype=torch.float64, device=d.device)
    tdist.all_reduce(slowest, op=tdist.ReduceOp.MAX)
    return slowest.tolist()


def _spread(times: list[float]) -> dict:
    """Median and the quartiles of repeated timings: the noise of one measurement."""
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return dict(seconds=statistics.median(times), lo=q[0], hi=q[2], repeats=len(times))


def time_all_reduce(d: Dist, algo: str, numel: int, repeats: int = 5, warmup: int = 3) -> float:
    """Median seconds of one all-reduce of ``numel`` float32, slowest rank per repeat.

    A barrier lines the ranks up before each repeat; each repeat counts as long
    as its slowest rank took (max over ranks), since the collective is only done
    when every rank has its result. The input is refreshed outside the timing.
    """
    return _spread(_all_reduce_times(d, algo, numel, repeats, warmup))["seconds"]


def _all_reduce_times(d: Dist, algo: str, numel: int, repeats: int, warmup: int) -> list[float]:
    if algo not in ALL_REDUCES:
        raise ValueError(f"unknown all-reduce {algo!r}: use one of {sorted(ALL_REDUCES)}")
    src = torch.randn(numel, generator=torch.Generator().manual_seed(d.rank)).to(d.device)
    return _slowest_times(d, ALL_REDUCES[algo], torch.empty_like(src), src, repeats, warmup)


def measure(
    d: Dist,
    sizes_bytes: list[int],
    algos: tuple[str, ...] = ("ring", "ps", "builtin"),
    repeats: int = 5,
) -> list[dict]:
    """Time each algorithm at each message size.

    Rows of dict(algo, bytes, world, seconds, lo, hi, repeats): seconds is the
    median over repeats, lo/hi the quartiles (the spread between repeats).
    """
    rows = []
    for nbytes in sizes_bytes:
        numel = max(1, int(nbytes) // 4)  # float32
        for algo in algos:
            times = _all_reduce_times(d, algo, numel, repeats, warmup=3)
            rows.append(dict(algo=algo, bytes=numel * 4, world=d.world_size, **_spread(times)))
    return rows


def _bounce(d: Dist, buf: torch.Tensor) -> None:
    """Rank 0 sends ``buf`` to rank 1, which sends it straight back (one round trip)."""
    if d.rank == 0:
        tdist.send(buf, 1)
        tdist.recv(buf, 1)
    elif d.rank == 1:
        tdist.recv(buf, 0)
        tdist.send(buf, 0)


def pingpong(d: Dist, sizes_bytes: list[int], repeats: int = 10, warmup: int = 3) -> list[dict]:
    """One-way time of a send/recv between ranks 0 and 1: half a round trip.

    The round trip is the standard way to time one message: both clocks are
    rank 0's, and the receiver is already waiting. Rows of
    dict(bytes, seconds, lo, hi, repeats), where seconds is the median one-way
    time and lo/hi its quartiles; other ranks (if any) only join the barriers.
    """
    if d.world_size < 2:
        raise ValueError("pingpong needs at least 2 ranks")
    rows = []
    for nbytes in sizes_bytes:
        numel = max(1, int(nbytes) // 4)
        src = torch.zeros(numel, device=d.device)
        times = _slowest_times(d, _bounce, torch.empty_like(src), src, repeats, warmup)
        rows.append(dict(bytes=numel * 4, **_spread([t / 2 for t in times])))
    return rows
