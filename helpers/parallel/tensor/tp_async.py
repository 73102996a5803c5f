"""Column-parallel linear layers whose backward overlaps communication with computation.

Megatron-LM's ``LinearWithGradAccumulationAndAsyncCommunication`` (and picotron's
``ColumnParallelLinear`` with its asynchronous all-reduce). The backward of Y = X W^T has two
matrix products, and only the first one feeds the collective:

    dX = dY W          partial on each rank: summed over the TP group (f's all-reduce,
                       or under sequence parallelism a reduce-scatter)
    dW = dY^T X        this rank's slice of the weight gradient: needs no message

so the collective on dX is launched with ``async_op=True`` and runs while dW is computed;
the backward waits for it only at the end:

    synchronous    [ dX = dY W ][ all-reduce dX ....... ][ dW = dY^T X ]
    overlapped     [ dX = dY W ][ dW = dY^T X ]
                               [ all-reduce dX ....... ]   <- in flight meanwhile

Under sequence parallelism the forward all-gathers the input X from its sequence shards.
Keeping the gathered X for backward would cost the whole sequence per rank; Megatron keeps
only this rank's shard and all-gathers it again in the backward, launched before dX = dY W
so that it too runs behind a matrix product (Korthikanti et al. 2022, section 4.2.2).

Several column layers that read the same input (q, k and v) share one call, so the input is
gathered once and its gradient summed once (Megatron fuses them into one QKV matrix).

    column_parallel(x, [layer_q, layer_k, layer_v], sequence_parallel=True) -> [q, k, v]
    AsyncColumnParallelLinear(full_linear, overlap=True)    a drop-in ColumnParallelLinear
"""

from __future__ import annotations

import time

import torch
import torch.distributed as tdist
from torch import nn

from helpers.dist import synchronize
from helpers.parallel.tensor.tp import ColumnParallelLinear
from helpers.parallel.tensor.tp_comm import SEQ, CommLog, tp_rank_size

__all__ = ["AsyncColumnParallelLinear", "column_parallel"]


def _now(log: CommLog | None, x: torch.Tensor) -> float:
    if log is None or not log.timed:
        return 0.0
    synchronize(x.device)
    return time.perf_counter()


def _gather_seq(x: torch.Tensor, group, async_op: bool):
    parts = [torch.empty_like(x) for _ in range(tp_rank_size(group)[1])]
    work = tdist.all_gather(parts, x.contiguous(), group=group, async_op=async_op)
    return parts, work


def _sum_input_grad(dx: torch.Tensor, group, sequence_parallel: bool, async_op: bool):
    """dX summed over the TP group: all-reduce, or reduce-scatter to this rank's tokens."""
    if not sequence_parallel:
        return dx, tdist.all_reduce(dx, group=group, async_op=async_op)
    rank, world = tp_rank_size(group)
    out = torch.empty_like(dx.chunk(world, dim=SEQ)[rank])
    parts = [p.contiguous() for p in dx.chunk(world, dim=SEQ)]
    return out, tdist.reduce_scatter(out, parts, group=group, async_op=async_op)


class _ColumnParallel(torch.autograd.Function):
    """Y_i = X W_i^T + b_i for column-parallel weights W_i that share the input X."""

    @staticmethod
    def forward(ctx, x, group, log, layer, sequence_parallel, overlap, *params):
        ctx.group, ctx.log, ctx.layer = group, log, layer
        ctx.sp, ctx.overlap, ctx.has_bias = sequence_parallel, overlap, params[1] is not None
        total = x
        if sequence_parallel:  # f': gather the sequence, keep only the shard for backward
            parts, _ = _gather_seq(x, group, async_op=False)
            total = torch.cat(parts, dim=SEQ)
            _record(log, "all_gather", "forward", layer, total, group)
        ctx.save_for_backward(x, *[p for p in params if p is not None])
        pairs = zip(params[0::2], params[1::2], strict=True)
        return tuple(nn.functional.linear(total, w, b) for w, b in pairs)

    @staticmethod
    def backward(ctx, *grads):
        x, *saved = ctx.saved_tensors
        weights = saved[0::2] if ctx.has_bias else saved
        log, group, t0 = ctx.log, ctx.group, _now(ctx.log, x)
        if ctx.sp:  # launch the re-gather of X first: it runs behind dX = dY W
            parts, gather = _gather_seq(x, group, async_op=True)
        dx = sum(g @ w for g, w in zip(grads, weights, strict=True))  # [B, T, in]: partial
        t1 = _now(log, dx)
        total = x
        if ctx.sp:
            gather.wait()
            total = torch.cat(parts, dim=SEQ)
            _record(log, "all_gather", "backward", ctx.layer, total, group)
        dx, work = _sum_input_grad(dx, group, ctx.sp, async_op=ctx.overlap)
        t2 = _now(log, dx)
        flat = total.reshape(-1, total.shape[-1])
        out = []
        for g in grads:
            g2 = g.reshape(-1, g.shape[-1])
            out.append(g2.t() @ flat)  # dW_i = dY_i^T X: this rank's rows of the weight
            out.append(g2.sum(0) if ctx.has_bias else None)
        t3 = _now(log, dx)
        if ctx.overlap:
            work.wait()
        t4 = _now(log, dx)
        op = "reduce_scatter" if ctx.sp else "all_reduce"
        _record(log, op, "backward", ctx.layer, dx, group, full=not ctx.sp, wait=t4 - t3)
        if log is not None and log.timed:
            comm = "in flight" if ctx.overlap else t2 - t1
            log.phases.append({"layer": ctx.layer, "dX": t1 - t0, "comm": comm,
                               "dW": t3 - t2, "wait": t4 - t3})  # fmt: skip
        return (dx, None, None, None, None, None, *out)


def _record(log, op, phase, layer, t, group, full=True, wait=0.0):
    if log is None:
        return
    world = tp_rank_size(group)[1]
    nbytes = t.numel() * t.element_size() * (1 if full else world)
    log.record(op, phase, layer, nbytes, world, wait)


def column_parallel(x, layers, group=None, log=None, name="col", sequence_parallel=False,
                    overlap=True):  # fmt: skip
    """Outputs [Y_1, ...] of column-parallel ``layers`` (ColumnParallelLinear, used for their
    weight and bias shards) reading the same input ``x``: f (or f' under sequence
    parallelism) once for all of them, with the backward's collective overlapped."""
    params = []
    for layer in layers:
        params += [layer.weight, layer.bias]
    if any(p is None for p in params[1::2]) and any(p is not None for p in params[1::2]):
        raise ValueError(f"{name}: give layers that all have a bias, or none that has")
    return list(_ColumnParallel.apply(x, group, log, name, sequence_parallel, overlap, *params))


class AsyncColumnParallelLinear(ColumnParallelLinear):
    """A ColumnParallelLinear (f in front, no gather after) whose backward all-reduces dX
    while it computes dW (``overlap=True``), or after it (``overlap=False``, for comparison).
    """

    def __init__(self, full: nn.Linear, group=None, log=None, name="col", overlap=True):
        super().__init__(full, group, gather_output=False, log=log, name=name)
        self.overlap = overlap

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (y,) = column_parallel(x, [self], self.group, self.log, self.name, overlap=self.overlap)
        return y
