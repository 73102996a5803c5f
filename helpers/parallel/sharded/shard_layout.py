"""How a unit's parameters are cut into N shards: FSDP1's flat buffer, or FSDP2's rows.

Both layouts give every rank a slice of the same length on the wire (``chunk``
elements), so one all-gather and one reduce-scatter serve a whole unit. They differ in
what a rank keeps, what they pad, and what the gathered buffer is:

    FlatLayout (FSDP1's FlatParameter)
        keeps    one 1-D vector: elements [r*chunk, (r+1)*chunk) of the unit's tensors
                 flattened and concatenated (a tensor may straddle two ranks)
        pads     the concatenation to a multiple of N: fewer than N elements per unit
        unshard  views of the gathered vector: no copy

    PerParameterLayout (FSDP2: every parameter a DTensor, Shard(0))
        keeps    one tensor per parameter: rows [r*c, (r+1)*c) with c = ceil(rows/N),
                 torch.chunk's split (the last ranks may hold fewer rows, or none)
        pads     each parameter to N*c rows on the wire: up to N-1 rows per parameter
        unshard  the gathered buffer is rank-major ([rank 0's rows of every parameter],
                 [rank 1's ...]); each parameter's rows are scattered through it, so it
                 is copied out (FSDP2's split_with_sizes_copy), and its gradient copied
                 back in the same order for the reduce-scatter (FSDP2's chunk_cat)

``shard`` gives what rank r keeps; ``gather_input`` the padded slice it puts into the
all-gather; ``unshard`` the full tensors from the gathered buffer; ``grads`` the rank's
shards' gradients from its reduce-scattered slice.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["FlatLayout", "PerParameterLayout", "LAYOUTS", "make_layout"]


class FlatLayout:
    """FSDP1: the unit's tensors as one flat vector, padded to a multiple of ``world``."""

    name = "flat"

    def __init__(self, shapes: list[torch.Size], rank: int, world: int):
        self.shapes, self.rank, self.world = shapes, rank, world
        self.numels = [math.prod(s) for s in shapes]
        self.chunk = math.ceil(sum(self.numels) / world)  # elements per rank on the wire
        self.padding = self.chunk * world - sum(self.numels)  # zeros sent with the unit

    def shard(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        flat = F.pad(flat, (0, self.padding))
        return [flat[self.rank * self.chunk : (self.rank + 1) * self.chunk].clone()]

    def gather_input(self, shards: list[torch.Tensor], dtype) -> torch.Tensor:
        return shards[0].detach().to(dtype)

    def unshard(self, full: torch.Tensor) -> list[torch.Tensor]:
        pieces = full[: sum(self.numels)].split(self.numels)
        return [p.view(s) for p, s in zip(pieces, self.shapes, strict=True)]  # views

    def grads(self, piece: torch.Tensor) -> list[torch.Tensor]:
        return [piece]


class PerParameterLayout:
    """FSDP2: each tensor cut on dim 0 into ``world`` chunks of ceil(rows / world) rows."""

    name = "per-parameter"

    def __init__(self, shapes: list[torch.Size], rank: int, world: int):
        if any(len(s) == 0 for s in shapes):
            raise ValueError("per-parameter sharding cuts dim 0: a 0-d parameter has none "
                             "(make it a 1-element tensor, or use the flat layout)")  # fmt: skip
        self.shapes, self.rank, self.world = shapes, rank, world
        self.numels = [math.prod(s) for s in shapes]
        self.rows = [math.ceil(s[0] / world) for s in shapes]  # rows per rank, padded
        self.sizes = [r * math.prod(s[1:]) for r, s in zip(self.rows, shapes, strict=True)]
        self.chunk = sum(self.sizes)  # elements per rank on the wire
        self.padding = self.chunk * world - sum(self.numels)

    def shard(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        # torch.chunk's split: rows [r*c, (r+1)*c), fewer (or none) on the last ranks
        return [t.detach()[self.rank * c : (self.rank + 1) * c].clone()
                for t, c in zip(tensors, self.rows, strict=True)]  # fmt: skip

    def gather_input(self, shards: list[torch.Tensor], dtype) -> torch.Tensor:
        parts = [F.pad(s.detach().to(dtype).reshape(-1), (0, size - s.numel()))
                 for s, size in zip(shards, self.sizes, strict=True)]  # fmt: skip
        return torch.cat(parts)

    def unshard(self, full: torch.Tensor) -> list[torch.Tensor]:
        by_rank = full.view(self.world, self.chunk)  # row r: what rank r put in
        out, start = [], 0
        for shape, rows, size in zip(self.shapes, self.rows, self.sizes, strict=True):
            block = by_rank[:, start : start + size]  # every rank's rows of this tensor
            out.append(block.reshape(self.world * rows, *shape[1:])[: shape[0]])  # a copy
            start += size
        return out

    def grads(self, piece: torch.Tensor) -> list[torch.Tensor]:
        out, start = [], 0
        for shape, rows, size in zip(self.shapes, self.rows, self.sizes, strict=True):
            mine = max(0, min(rows, shape[0] - self.rank * rows))  # this rank's real rows
            out.append(piece[start : start + size].view(rows, *shape[1:])[:mine])
            start += size
        return out


LAYOUTS = {cls.name: cls for cls in (FlatLayout, PerParameterLayout)}


def make_layout(name: str, shapes, rank: int, world: int):
    """The layout called ``name`` ("flat" or "per-parameter") for tensors of ``shapes``."""
    if name not in LAYOUTS:
        raise ValueError(f"layout must be one of {sorted(LAYOUTS)}, not {name!r}")
    return LAYOUTS[name](list(shapes), rank, world)
