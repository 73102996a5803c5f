"""The parallel degrees of a job and the named DeviceMesh they make (torchtitan's ParallelDims).

    world = pp x dp x tp, ranks laid out with TP innermost:

        rank = (pp_index * dp + dp_index) * tp + tp_index

    2 nodes x 8 GPUs, pp=4, dp=2, tp=2 (seed 000's example):

        node 0: ranks 0-7           node 1: ranks 8-15
        pp stage 0: dp0 [0 1]  dp1 [2 3]     pp stage 2: dp0 [8 9]   dp1 [10 11]
        pp stage 1: dp0 [4 5]  dp1 [6 7]     pp stage 3: dp0 [12 13] dp1 [14 15]

    A TP group is two neighbouring ranks, always on one node (NVLink): TP talks the most.
    DP groups stride by tp; PP groups stride by dp * tp and may cross nodes: PP outermost, as
    DeepSpeed, torchtitan and Megatron-Core's default order lay it (Llama 3 puts DP outermost
    instead, for FSDP's prefetched traffic; this layout does not express that order).

``ParallelDims(dp, tp, pp, world_size)`` checks the degrees and says what would work;
``dp=-1`` means "whatever is left". ``groups("tp")`` lists the rank groups without any
process group, so planners and drawings use the very layout ``build_mesh`` makes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

__all__ = ["ParallelDims", "divisors", "DIM_NAMES"]

DIM_NAMES = ("pp", "dp", "tp")  # outermost to innermost


@functools.lru_cache(maxsize=4096)
def _crosses(shape: tuple[int, int, int], per_node: int, axis: int) -> bool:
    nodes = np.moveaxis(np.arange(int(np.prod(shape))).reshape(shape) // per_node, axis, -1)
    return bool((nodes.max(-1) != nodes.min(-1)).any())


def divisors(n: int) -> list[int]:
    return list(_divisors(n))


@functools.lru_cache(maxsize=1024)
def _divisors(n: int) -> tuple[int, ...]:
    return tuple(k for k in range(1, n + 1) if n % k == 0)


@dataclass(frozen=True)
class ParallelDims:
    dp: int = -1
    tp: int = 1
    pp: int = 1
    world_size: int = 1
    gpus_per_node: int | None = None  # when given, TP must stay inside a node

    def __post_init__(self):
        for name in ("tp", "pp", "world_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        model = self.tp * self.pp
        if self.world_size % model:
            raise ValueError(
                f"tp x pp = {self.tp} x {self.pp} = {model} does not divide world_size="
                f"{self.world_size}; tp x pp must be one of {divisors(self.world_size)}"
            )
        if self.dp == -1:  # fill in the remainder, like torchtitan's dp_shard=-1
            object.__setattr__(self, "dp", self.world_size // model)
        if self.dp < 1 or self.dp * model != self.world_size:
            raise ValueError(
                f"dp x tp x pp = {self.dp} x {self.tp} x {self.pp} = {self.dp * model} but "
                f"world_size={self.world_size}; use dp={self.world_size // model} (or dp=-1)"
            )
        g = self.gpus_per_node
        if g is not None and (self.tp > g or g % self.tp):
            raise ValueError(
                f"tp={self.tp} would split a tensor-parallel group across nodes of {g} GPUs; "
                f"keep TP inside a node: tp in {divisors(g)}"
            )

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.pp, self.dp, self.tp)

    def grid(self) -> np.ndarray:
        """rank numbers as an array of shape (pp, dp, tp)."""
        return np.arange(self.world_size).reshape(self.shape)

    def coords(self, rank: int) -> dict[str, int]:
        pp, dp, tp = np.unravel_index(rank, self.shape)
        return {"pp": int(pp), "dp": int(dp), "tp": int(tp)}

    def groups(self, dim: str) -> list[list[int]]:
        """The rank groups that talk along one dimension, e.g. groups("tp") -> [[0, 1], ...]."""
        if dim not in DIM_NAMES:
            raise KeyError(f"unknown mesh dimension {dim!r}; choose one of {DIM_NAMES}")
        axis = DIM_NAMES.index(dim)
        moved = np.moveaxis(self.grid(), axis, -1).reshape(-1, self.shape[axis])
        return sorted(row.tolist() for row in moved)

    def node_of(self, rank: int) -> int:
        return rank // (self.gpus_per_node or self.world_size)

    def crosses_nodes(self, dim: str) -> bool:
        """True when some group of this dimension spans two nodes (slow links)."""
        if dim not in DIM_NAMES:
            raise KeyError(f"unknown mesh dimension {dim!r}; choose one of {DIM_NAMES}")
        return _crosses(self.shape, self.gpus_per_node or self.world_size, DIM_NAMES.index(dim))

    def build_mesh(self, device_type: str = "cpu", names: tuple[str, ...] = DIM_NAMES):
        """init_device_mesh with dims ("pp", "dp", "tp"); pass names=("dp", "tp") for 2D.

        Needs a process group of world_size ranks (helpers.dist.init() or a fake one).
        """
        from torch.distributed.device_mesh import init_device_mesh

        unknown = set(names) - set(DIM_NAMES)
        if unknown:
            raise KeyError(f"unknown mesh dimension(s) {sorted(unknown)}; use {DIM_NAMES}")
        left_out = [n for n in DIM_NAMES if n not in names and getattr(self, n) > 1]
        if left_out:
            raise ValueError(f"{left_out} > 1 but not in names={names}: include them")
        ordered = tuple(n for n in DIM_NAMES if n in names)  # keep TP innermost whatever the order
        return init_device_mesh(
            device_type, tuple(getattr(self, n) for n in ordered), mesh_dim_names=ordered
        )
