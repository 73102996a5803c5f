"""Ring attention (Liu et al. 2023): K/V blocks travel round a ring of ranks, N - 1 steps.

Each of N ranks holds its queries, keys and values (a share of the sequence, see
helpers.parallel.context.context_layout). Its queries need every rank's keys. Instead of gathering
them all, the ranks pass K/V blocks to the right-hand neighbour:

    step 0   rank r attends to its own block r            and sends it to r + 1
    step s   rank r attends to block (r - s) % N          (received from r - 1)
    ...      after N - 1 steps every rank has seen every block, once

and merges the partial results with their log-sum-exp (helpers.parallel.context.online_softmax).
A rank holds at most two K/V blocks at a time (the one it computes on and the one arriving),
never the whole sequence, and with ``overlap=True`` the next block is already in flight
(send and receive posted as one batch) while the current one is computed: a step then
costs about max(compute, transfer) instead of their sum.

    ring_attention(d, q, k, v, positions, causal)   forward only (no autograd), optional timeline
    RingAttention.apply(q, k, v, positions, causal, group)   with the ring backward:
        dK/dV of a block travel round the ring with it, each rank adding its contribution,
        and arrive back at the block's owner after N steps.

q, k, v: [..., L_r, D] on d.device (L_r = len(positions[rank])); positions: every rank's
global token positions (all ranks know the layout, nothing about it is sent).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as tdist

from helpers import devices
from helpers.parallel.context.context_layout import sub_blocks
from helpers.parallel.context.online_softmax import block_attention, merge

__all__ = ["RingAttention", "exchange", "ring_attention", "ring_peers"]


def ring_peers(group=None) -> tuple[int, int, int, int]:
    """(rank in group, group size, global rank of the right neighbour, of the left one)."""
    rank, n = tdist.get_rank(group), tdist.get_world_size(group)
    glob = (lambda i: tdist.get_global_rank(group, i)) if group is not None else (lambda i: i)
    return rank, n, glob((rank + 1) % n), glob((rank - 1) % n)


def exchange(send: torch.Tensor, recv: torch.Tensor, right: int, left: int, group=None) -> list:
    """Post: send ``send`` to the right, receive into ``recv`` from the left; return requests.

    The pair goes as ONE batch (``batch_isend_irecv``): with 2 ranks the right-hand and the
    left-hand neighbour are the same rank, and NCCL can deadlock on a separate, unpaired send
    and receive between two ranks; batched, it posts them together (picotron does the same).
    """
    ops = [
        tdist.P2POp(tdist.isend, send, right, group),
        tdist.P2POp(tdist.irecv, recv, left, group),
    ]
    return tdist.batch_isend_irecv(ops)


def _attend_block(q, kv, q_pos, k_pos, causal, out, lse):
    """Merge q's attention over one K/V block into the running (out, lse), in place."""
    for qs, ks, mask in sub_blocks(q_pos, k_pos, causal):
        mask = None if mask is None else mask.to(q.device)
        o, s = block_attention(q[..., qs, :], kv[0][..., ks, :], kv[1][..., ks, :], mask)
        out[..., qs, :], lse[..., qs] = merge(out[..., qs, :], lse[..., qs], o, s)


def _ring_forward(q, k, v, positions, causal, group, overlap=True, timeline=None):
    rank, n, right, left = ring_peers(group)
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
    kv = torch.stack([k, v])  # one message per step: [2, ..., L, D]
    for step in range(n):
        src = (rank - step) % n  # whose block this rank holds now
        reqs, nxt = [], None
        t_post = time.perf_counter()
        if step < n - 1:  # the next block: from the left, of rank (rank - step - 1)
            shape = (*kv.shape[:-2], len(positions[(src - 1) % n]), kv.shape[-1])
            nxt = torch.empty(shape, dtype=kv.dtype, device=kv.device)
            reqs = exchange(kv, nxt, right, left, group)
            if not overlap:  # blocking: the block has arrived before the compute starts
                for req in reqs:
                    req.wait()
                reqs = []  # (a gloo request must not be waited on twice)
        t0, cpu0 = time.perf_counter(), time.thread_time()
        _attend_block(q, kv, positions[rank], positions[src], causal, out, lse)
        if timeline is not None:
            devices.synchronize(q.device)
        t1, cpu = time.perf_counter(), time.thread_time() - cpu0
        for req in reqs:
            req.wait()
        if timeline is not None:
            devices.synchronize(q.device)
            timeline.append({"step": step, "post": t_post, "compute": (t0, t1), "cpu_s": cpu,
                             "arrived": time.perf_counter()})  # fmt: skip
        kv = nxt if nxt is not None else kv
    return out, lse


def ring_attention(d, q, k, v, positions, causal=False, overlap=True, timeline=None, group=None):
    """This rank's attention output over the whole sequence, by ring (forward only).

    d: this rank's helpers.dist.Dist (its device is where q, k, v live).
    timeline: a list to append one dict per step (times from time.perf_counter, synchronised
        on GPU): when the next block was posted, the compute span, when it had arrived, and
        the CPU seconds this thread spent computing (time.thread_time: on CPU ranks that
        share cores, the work itself, whatever the waiting for a core).
    """
    if q.device != d.device:
        raise ValueError(f"q is on {q.device}, but this rank computes on {d.device}: move it")
    with torch.no_grad():
        out, _ = _ring_forward(q, k, v, positions, causal, group, overlap, timeline)
    return out


def _block_grads(q, kv, dout, out_dot, lse, q_pos, k_pos, causal, dq, dkv):
    """Add one K/V block's contribution to dq (this rank's) and dkv (the block's)."""
    scale = q.shape[-1] ** -0.5
    for qs, ks, mask in sub_blocks(q_pos, k_pos, causal):
        k, v = kv[0][..., ks, :], kv[1][..., ks, :]
        s = (q[..., qs, :] @ k.transpose(-1, -2)) * scale
        if mask is not None:
            s = s.masked_fill(~mask.to(q.device), float("-inf"))
        p = torch.exp(s - lse[..., qs, None])  # this block's softmax weights, final ones
        dp = dout[..., qs, :] @ v.transpose(-1, -2)
        ds = p * (dp - out_dot[..., qs, None]) * scale
        dq[..., qs, :] += ds @ k
        dkv[0][..., ks, :] += ds.transpose(-1, -2) @ q[..., qs, :]
        dkv[1][..., ks, :] += p.transpose(-1, -2) @ dout[..., qs, :]


class RingAttention(torch.autograd.Function):
    """Ring attention with its backward: ``RingAttention.apply(q, k, v, positions, causal, group)``."""

    @staticmethod
    def forward(ctx, q, k, v, positions, causal=False, group=None):
        out, lse = _ring_forward(q, k, v, positions, causal, group)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.positions, ctx.causal, ctx.group = positions, causal, group
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        positions, causal, group = ctx.positions, ctx.causal, ctx.group
        rank, n, right, left = ring_peers(group)
        dout = dout.contiguous()
        out_dot = (dout * out).sum(-1)  # D_i = sum_d dO_id O_id
        dq = torch.zeros_like(q)
        kv = torch.stack([k, v])
        dkv = torch.zeros_like(kv)  # the gradient of the block this rank holds, travelling with it
        for step in range(n):
            src = (rank - step) % n
            reqs, nxt = [], None
            if step < n - 1:  # K/V of the next block, overlapped with this block's compute
                nxt = kv.new_empty((*kv.shape[:-2], len(positions[(src - 1) % n]), kv.shape[-1]))
                reqs = exchange(kv, nxt, right, left, group)
            _block_grads(q, kv, dout, out_dot, lse, positions[rank], positions[src], causal,
                         dq, dkv)  # fmt: skip
            # dK/dV of block src go right, to the next rank that sees it (after N steps: its owner)
            incoming = dkv.new_empty(
                (*dkv.shape[:-2], len(positions[(src - 1) % n]), dkv.shape[-1])
            )
            for req in [*reqs, *exchange(dkv, incoming, right, left, group)]:
                req.wait()
            kv, dkv = (nxt if nxt is not None else kv), incoming
        return dq, dkv[0], dkv[1], None, None, None
