"""Megatron's communication operators for tensor parallelism, and the bytes they move.

    f  copy_to_tp       identity forward, all-reduce backward   (before column layers)
    g  reduce_from_tp   all-reduce forward, identity backward   (after row layers)
       gather_from_tp   all-gather forward, keep-my-slice backward (a gathered column output)
       scatter_to_tp    keep-my-slice forward, all-gather backward (a row layer's whole input)

Sequence parallelism (Korthikanti et al. 2022) keeps activations split along the sequence
(dim 1 of [B, T, d]) between the layer pairs, and replaces f and g by a conjugate pair:

    f' gather_from_sp        all-gather forward, reduce-scatter backward (before column layers)
    g' reduce_scatter_to_sp  reduce-scatter forward, all-gather backward (after row layers)
       split_to_sp           keep-my-slice forward, all-gather backward  (entering the region)
       gather_from_sp(grad_is_partial=False): all-gather forward, keep-my-slice backward
                                                                  (leaving it, to replicated code)

An all-reduce is a reduce-scatter followed by an all-gather: f' and g' send the same bytes as
f and g, in two halves placed around the layers, so that what lies between the pairs (norms,
residuals, dropout) is stored and computed on T/N tokens.

Every collective is recorded in a ``CommLog`` (which, forward or backward, how many bytes)
when one is passed: values, not globals.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as tdist

from helpers.dist import synchronize

__all__ = [
    "Comm",
    "CommLog",
    "copy_to_tp",
    "gather_from_sp",
    "gather_from_tp",
    "reduce_from_tp",
    "reduce_scatter_to_sp",
    "scatter_to_tp",
    "split_to_sp",
    "tp_rank_size",
]

SEQ = 1  # the sequence dimension of [B, T, d] activations


def tp_rank_size(group=None) -> tuple[int, int]:
    """(rank inside the TP group, TP size); (0, 1) without torch.distributed."""
    if not tdist.is_initialized():
        return 0, 1
    return tdist.get_rank(group), tdist.get_world_size(group)


# --------------------------------------------------------------------------- bytes


@dataclass(frozen=True)
class Comm:
    """One collective: ``nbytes`` is the full tensor; ``sent`` what one rank sends (ring)."""

    op: str  # "all_reduce" | "all_gather" | "reduce_scatter"
    phase: str  # "forward" | "backward"
    layer: str
    nbytes: int
    sent: float
    seconds: float = 0.0  # wall time of the call, when the log is ``timed``


@dataclass
class CommLog:
    """Every collective one rank ran through this module, in order. ``timed=True`` also
    records how long each call took (the device synchronised before each clock reading)."""

    comms: list[Comm] = field(default_factory=list)
    timed: bool = False
    phases: list[dict] = field(default_factory=list)  # timed backward phases (tp_async)

    def record(self, op: str, phase: str, layer: str, nbytes: int, world: int,
               seconds: float = 0.0) -> None:  # fmt: skip
        # Ring algorithms: all-reduce sends 2(N-1)/N of the tensor; all-gather and
        # reduce-scatter (N-1)/N of the full (gathered, or not yet scattered) tensor.
        factor = 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world
        self.comms.append(Comm(op, phase, layer, nbytes, factor * nbytes, seconds))

    def count(self, op: str | None = None, phase: str | None = None) -> int:
        return len(self._select(op, phase))

    def bytes(self, op: str | None = None, phase: str | None = None) -> int:
        return sum(c.nbytes for c in self._select(op, phase))

    def sent(self, op: str | None = None, phase: str | None = None) -> float:
        return sum(c.sent for c in self._select(op, phase))

    def seconds(self, op: str | None = None, phase: str | None = None) -> float:
        return sum(c.seconds for c in self._select(op, phase))

    def _select(self, op, phase) -> list[Comm]:
        return [c for c in self.comms if op in (None, c.op) and phase in (None, c.phase)]

    def clear(self) -> None:
        self.comms.clear()
        self.phases.clear()


def _clock(log, x: torch.Tensor) -> float:
    """perf_counter after the device's queued work, when ``log`` times its calls."""
    if log is None or not log.timed:
        return 0.0
    synchronize(x.device)
    return time.perf_counter()


def _all_reduce(x: torch.Tensor, group, log, phase: str, layer: str) -> torch.Tensor:
    x = x.contiguous().clone()  # never sum into a tensor autograd saved
    t0 = _clock(log, x)
    tdist.all_reduce(x, group=group)
    if log is not None:
        log.record("all_reduce", phase, layer, x.numel() * x.element_size(), _tp_size(group),
                   _clock(log, x) - t0)  # fmt: skip
    return x


def _all_gather(x: torch.Tensor, group, log, phase: str, layer: str, dim: int = -1):
    # x: [..., n, ...] on each rank -> N * n along dim, rank r's piece at [r n, (r+1) n)
    world = _tp_size(group)
    parts = [torch.empty_like(x) for _ in range(world)]
    t0 = _clock(log, x)
    tdist.all_gather(parts, x.contiguous(), group=group)
    out = torch.cat(parts, dim=dim)
    if log is not None:
        log.record("all_gather", phase, layer, out.numel() * out.element_size(), world,
                   _clock(log, x) - t0)  # fmt: skip
    return out


def _reduce_scatter(x: torch.Tensor, group, log, phase: str, layer: str, dim: int = SEQ):
    # x: a full-size partial sum on each rank -> this rank's slice along dim of the sum
    world = _tp_size(group)
    parts = [p.contiguous() for p in _split(x, group, dim)[1]]
    out = torch.empty_like(parts[0])
    t0 = _clock(log, x)
    tdist.reduce_scatter(out, parts, group=group)
    if log is not None:
        log.record("reduce_scatter", phase, layer, x.numel() * x.element_size(), world,
                   _clock(log, x) - t0)  # fmt: skip
    return out


def _split(x: torch.Tensor, group, dim: int):
    rank, world = tp_rank_size(group)
    if x.shape[dim] % world:
        what = "last dimension" if dim == -1 else f"dimension {dim} (the sequence)"
        raise ValueError(
            f"cannot split the {what} ({x.shape[dim]}) over a TP size of {world}: "
            f"make it a multiple of {world}"
        )
    return rank, x.chunk(world, dim=dim)


def _my_slice(x: torch.Tensor, group, dim: int = -1) -> torch.Tensor:
    rank, parts = _split(x, group, dim)
    return parts[rank].contiguous()


def _tp_size(group) -> int:
    return tp_rank_size(group)[1]


# --------------------------------------------------------------------------- f, g, ...


class _CopyToTP(torch.autograd.Function):
    """f: forward identity, backward all-reduce (every rank's input gradient is partial)."""

    @staticmethod
    def forward(ctx, x, group, log, layer):
        ctx.group, ctx.log, ctx.layer = group, log, layer
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group, ctx.log, "backward", ctx.layer), None, None, None


class _ReduceFromTP(torch.autograd.Function):
    """g: forward all-reduce (sum the partial outputs), backward identity."""

    @staticmethod
    def forward(ctx, x, group, log, layer):
        return _all_reduce(x, group, log, "forward", layer)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None


class _GatherFromTP(torch.autograd.Function):
    """Forward all-gather on the last dim; backward keeps this rank's slice (no message)."""

    @staticmethod
    def forward(ctx, x, group, log, layer):
        ctx.group = group
        return _all_gather(x, group, log, "forward", layer)

    @staticmethod
    def backward(ctx, grad):
        return _my_slice(grad, ctx.group), None, None, None


class _ScatterToTP(torch.autograd.Function):
    """Forward keeps this rank's slice of the last dim (no message); backward all-gather."""

    @staticmethod
    def forward(ctx, x, group, log, layer):
        ctx.group, ctx.log, ctx.layer = group, log, layer
        return _my_slice(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.group, ctx.log, "backward", ctx.layer), None, None, None


def copy_to_tp(x, group=None, log=None, layer=""):
    return _CopyToTP.apply(x, group, log, layer)


def reduce_from_tp(x, group=None, log=None, layer=""):
    return _ReduceFromTP.apply(x, group, log, layer)


def gather_from_tp(x, group=None, log=None, layer=""):
    return _GatherFromTP.apply(x, group, log, layer)


def scatter_to_tp(x, group=None, log=None, layer=""):
    return _ScatterToTP.apply(x, group, log, layer)


# --------------------------------------------------------------------------- f', g', ...


class _GatherFromSP(torch.autograd.Function):
    """f': all-gather the sequence forward; backward reduce-scatter (the column layers after
    it give each rank a partial dL/dx of the whole sequence) or, when the code after it is
    replicated (grad_is_partial=False), keep this rank's slice."""

    @staticmethod
    def forward(ctx, x, group, log, layer, grad_is_partial):
        ctx.group, ctx.log, ctx.layer, ctx.partial = group, log, layer, grad_is_partial
        return _all_gather(x, group, log, "forward", layer, dim=SEQ)

    @staticmethod
    def backward(ctx, grad):
        if ctx.partial:
            grad = _reduce_scatter(grad, ctx.group, ctx.log, "backward", ctx.layer)
        else:
            grad = _my_slice(grad, ctx.group, SEQ)
        return grad, None, None, None, None


class _ReduceScatterToSP(torch.autograd.Function):
    """g': reduce-scatter forward (sum the row layers' partial outputs, keep my tokens);
    backward all-gather (every rank needs dL/dy for the whole sequence)."""

    @staticmethod
    def forward(ctx, x, group, log, layer):
        ctx.group, ctx.log, ctx.layer = group, log, layer
        return _reduce_scatter(x, group, log, "forward", layer)

    @staticmethod
    def backward(ctx, grad):
        whole = _all_gather(grad, ctx.group, ctx.log, "backward", ctx.layer, dim=SEQ)
        return whole, None, None, None


class _SplitToSP(torch.autograd.Function):
    """Keep this rank's tokens (no message); backward all-gather the sequence."""

    @staticmethod
    def forward(ctx, x, group, log, layer):
        ctx.group, ctx.log, ctx.layer = group, log, layer
        return _my_slice(x, group, SEQ)

    @staticmethod
    def backward(ctx, grad):
        whole = _all_gather(grad, ctx.group, ctx.log, "backward", ctx.layer, dim=SEQ)
        return whole, None, None, None


def gather_from_sp(x, group=None, log=None, layer="", grad_is_partial=True):
    return _GatherFromSP.apply(x, group, log, layer, grad_is_partial)


def reduce_scatter_to_sp(x, group=None, log=None, layer=""):
    return _ReduceScatterToSP.apply(x, group, log, layer)


def split_to_sp(x, group=None, log=None, layer=""):
    return _SplitToSP.apply(x, group, log, layer)
