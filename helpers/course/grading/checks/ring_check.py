"""What a ring all-reduce's recorded traffic must look like (lab 1's "by hand" checks).

``ring_problems`` reads one rank's ``Traffic`` (helpers.course.grading.recorder.traffic) and says,
in words a learner can act on, why it is not a ring: messages to or from the
wrong neighbour, too many elements sent, or too few received.

``nccl_order_problems`` reads every rank's, in the order each posted its messages, and says
whether NCCL could run them (``helpers.standin.nccl_order``): on GPUs a rank's operations in
a group run in the order it posted them and a send completes only when the matching
receive runs, so an ``isend`` then a ``recv`` on every rank hangs, while gloo, under the
tests, lets it pass. Every NCCL-safe ring passes: a ``batch_isend_irecv`` per step, or
sends and receives ordered by rank parity.
"""

from __future__ import annotations

import math

from helpers.course.grading.recorder.traffic import Traffic
from helpers.standin.nccl_explain import p2p_problems
from helpers.standin.nccl_order import Op

__all__ = ["ring_problems", "ring_send_bound", "nccl_order_problems"]


def ring_send_bound(numel: int, world_size: int) -> int:
    """Most elements one rank may send in a ring all-reduce: 2(N-1) chunks of ceil(n/N).

    That is 2(N-1)/N * n plus rounding (tensor_split's chunks differ by at most one).
    """
    return 2 * (world_size - 1) * math.ceil(numel / world_size)


def ring_problems(
    traffic: Traffic, rank: int, world_size: int, numel: int, volume: bool = True
) -> list[str]:
    """Why this rank's traffic is not a ring all-reduce of ``numel`` elements ([] if it is).

    Always checked: sends go only right, receives come only from the left, and enough
    elements arrived. volume=True also checks the upper bound on elements sent.
    """
    n = world_size
    right, left = (rank + 1) % n, (rank - 1) % n
    problems = []
    wrong_dst = sorted({m.peer for m in traffic.sent() if m.peer != right})
    if wrong_dst:
        problems.append(
            f"rank {rank} sent to rank(s) {wrong_dst}; in a ring it sends only to its "
            f"right-hand neighbour (rank + 1) % N = {right}"
        )
    wrong_src = sorted({m.peer for m in traffic.received() if m.peer != left})
    if wrong_src:
        problems.append(
            f"rank {rank} received from rank(s) {wrong_src}; in a ring it receives only "
            f"from its left-hand neighbour (rank - 1) % N = {left}"
        )
    bound = ring_send_bound(numel, n)
    if volume and traffic.elements_sent() > bound:
        problems.append(
            f"rank {rank} sent {traffic.elements_sent()} elements for a tensor of {numel} on "
            f"{n} ranks; a ring sends at most 2(N-1)/N * n = {bound} (plus rounding): send "
            "one chunk of n/N elements per step, not the whole tensor"
        )
    # Every rank must learn the other ranks' contributions: without messages, the
    # sum came from somewhere else (a collective the recorder did not see).
    least = numel - math.ceil(numel / n) if n > 1 else 0
    if traffic.elements_received() < least:
        problems.append(
            f"rank {rank} received only {traffic.elements_received()} elements, but an "
            f"all-reduce of {numel} elements on {n} ranks needs at least {least}: "
            "the sum must arrive through recv/irecv"
        )
    return problems


def _batches(traffic: Traffic) -> list[int | None]:
    """Each message's batch: its batch_isend_irecv's number where the recording has them;
    where it has none, isends and irecvs posted back to back (a send and a receive at least,
    no blocking call between them) are taken as one batch."""
    marks = [getattr(m, "batch", None) for m in traffic.messages]
    if any(hasattr(m, "batch") for m in traffic.messages):
        return marks
    run: list[int] = []
    for i, m in enumerate([*traffic.messages, None]):
        if m is not None and m.op in ("isend", "irecv"):
            run.append(i)
            continue
        kinds = {traffic.messages[k].outgoing for k in run}
        for k in run if len(kinds) == 2 else []:
            marks[k] = run[0]
        run = []
    return marks


def _ops(rank: int, traffic: Traffic) -> list[Op]:
    """A rank's messages as NCCL's model takes them. A blocking send or recv is waited for
    before the next message is posted; an isend or irecv's wait is not on the wire (the model
    lets it wait as late as possible)."""
    ops, after = [], ()
    for i, (m, batch) in enumerate(zip(traffic.messages, _batches(traffic), strict=True)):
        ops.append(Op(rank, i, "send" if m.outgoing else "recv", m.peer, batch, m.numel,
                      name=m.op, after=after))  # fmt: skip
        after = (i,) if m.op in ("send", "recv") else ()
    return ops


def nccl_order_problems(traffics: list[Traffic]) -> list[str]:
    """Why NCCL would hang on these messages (one Traffic per rank, index = rank), or []."""
    return p2p_problems([_ops(rank, t) for rank, t in enumerate(traffics)])
