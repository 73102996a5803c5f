"""Megatron's communication operators for tensor parallelism, and the bytes they move.

    f  copy_to_tp       identity forward, all-reduce backward   (before column layers)
    g  reduce_from_tp   all-reduce forward, identity backward   (after row layers)
       gather_from_tp   all-gather forward, keep-my-slice backward (a gathered column output)
       scatter_to_tp    keep-my-slice forward, all-gather backward (a row layer's whole input)

f and g are conjugate: each is the other's transpose, so a column layer followed by a row
layer (helpers.parallel.tp) communicates once forward (g) and once backward (f).

Every collective goes through ``_all_reduce`` or ``_all_gather_last``, which record it in
a ``CommLog`` (which, forward or backward, how many bytes) when one is passed: values, not
globals.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as tdist

__all__ = [
    "Comm",
    "CommLog",
    "copy_to_tp",
    "gather_from_tp",
    "reduce_from_tp",
    "scatter_to_tp",
    "tp_rank_size",
]


def tp_rank_size(group=None) -> tuple[int, int]:
    """(rank inside the TP group, TP size); (0, 1) without torch.distributed."""
    if not tdist.is_initialized():
        return 0, 1
    return tdist.get_rank(group), tdist.get_world_size(group)


# --------------------------------------------------------------------------- bytes


@dataclass(frozen=True)
class Comm:
    """One collective: ``nbytes`` is the full tensor; ``sent`` what one rank sends (ring)."""

    op: str  # "all_reduce" | "all_gather"
    phase: str  # "forward" | "backward"
    layer: str
    nbytes: int
    sent: float


@dataclass
class CommLog:
    """Every collective one rank ran through this module, in order."""

    comms: list[Comm] = field(default_factory=list)

    def record(self, op: str, phase: str, layer: str, nbytes: int, world: int) -> None:
        # Ring algorithms: all-reduce sends 2(N-1)/N of the tensor, all-gather (N-1)/N.
        factor = 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world
        self.comms.append(Comm(op, phase, layer, nbytes, factor * nbytes))

    def count(self, op: str | None = None, phase: str | None = None) -> int:
        return len(self._select(op, phase))

    def bytes(self, op: str | None = None, phase: str | None = None) -> int:
        return sum(c.nbytes for c in self._select(op, phase))

    def sent(self, op: str | None = None, phase: str | None = None) -> float:
        return sum(c.sent for c in self._select(op, phase))

    def _select(self, op, phase) -> list[Comm]:
        return [c for c in self.comms if op in (None, c.op) and phase in (None, c.phase)]

    def clear(self) -> None:
        self.comms.clear()


def _all_reduce(x: torch.Tensor, group, log, phase: str, layer: str) -> torch.Tensor:
    x = x.contiguous().clone()  # never sum into a tensor autograd saved
    tdist.all_reduce(x, group=group)
    if log is not None:
        log.record("all_reduce", phase, layer, x.numel() * x.element_size(), _tp_size(group))
    return x


def _all_gather_last(x: torch.Tensor, group, log, phase: str, layer: str) -> torch.Tensor:
    # x: [..., n] on each rank -> [..., N * n], rank r's piece at columns [r n, (r+1) n)
    world = _tp_size(group)
    parts = [torch.empty_like(x) for _ in range(world)]
    tdist.all_gather(parts, x.contiguous(), group=group)
    out = torch.cat(parts, dim=-1)
    if log is not None:
        log.record("all_gather", phase, layer, out.numel() * out.element_size(), world)
    return out


def _my_slice_last(x: torch.Tensor, group) -> torch.Tensor:
    rank, world = tp_rank_size(group)
    if x.shape[-1] % world:
        raise ValueError(
            f"cannot split the last dimension ({x.shape[-1]}) over a TP size of {world}: "
            f"make it a multiple of {world}"
        )
    return x.chunk(world, dim=-1)[rank].contiguous()


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
        return _all_gather_last(x, group, log, "forward", layer)

    @staticmethod
    def backward(ctx, grad):
        return _my_slice_last(grad, ctx.group), None, None, None


class _ScatterToTP(torch.autograd.Function):
    """Forward keeps this rank's slice of the last dim (no message); backward all-gather."""

    @staticmethod
    def forward(ctx, x, group, log, layer):
        ctx.group, ctx.log, ctx.layer = group, log, layer
        return _my_slice_last(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_last(grad, ctx.group, ctx.log, "backward", ctx.layer), None, None, None


def copy_to_tp(x, group=None, log=None, layer=""):
    return _CopyToTP.apply(x, group, log, layer)


def reduce_from_tp(x, group=None, log=None, layer=""):
    return _ReduceFromTP.apply(x, group, log, layer)


def gather_from_tp(x, group=None, log=None, layer=""):
    return _GatherFromTP.apply(x, group, log, layer)


def scatter_to_tp(x, group=None, log=None, layer=""):
    return _ScatterToTP.apply(x, group, log, layer)
