"""Tensor parallelism by hand: column- and row-parallel linear layers (Megatron-LM).

torch's ``nn.Linear`` computes ``Y = X W^T + b`` with ``W`` of shape [out, in]. In the
maths of seed 004 (``Y = X A`` with ``A = W^T`` of shape [in, out]):

    column split   A = [A_1 | A_2]          rank r: Y_r = X A_r   (its out-features)
                   torch: W.chunk(N, dim=0)  full Y = all-gather of the Y_r (last dim)
    row split      A = [A_1 ; A_2]           rank r: X_r A_r      (its in-features)
                   torch: W.chunk(N, dim=1)  full Y = all-reduce (sum) of the X_r A_r

    TP group of N = 2 ranks, an MLP  X -> fc1 (column) -> GeLU -> fc2 (row) -> Y
        rank 0:  X --f--> X W1_0^T -> gelu -> . W2_0^T --+
        rank 1:  X --f--> X W1_1^T -> gelu -> . W2_1^T --+--g--> Y  (one all-reduce)

Megatron's conjugate operators f (identity forward, all-reduce backward) and g (all-reduce
forward, identity backward), the gather/scatter pair and the ``CommLog`` that counts bytes
live in helpers.parallel.tensor.tp_comm (picotron's split: layers here, communications there).
``param_groups`` gives an optimizer a DTensor model's parameters in groups it can step on a GPU.
"""

from __future__ import annotations

import torch
from torch import nn

from helpers.parallel.tensor.tp_comm import (
    Comm,
    CommLog,
    copy_to_tp,
    gather_from_tp,
    reduce_from_tp,
    reduce_scatter_to_sp,
    scatter_to_tp,
    tp_rank_size,
)

__all__ = [
    "ColumnParallelLinear",
    "Comm",
    "CommLog",
    "ParallelAttention",
    "ParallelMLP",
    "RowParallelLinear",
    "check_divides",
    "check_tp_size",
    "copy_to_tp",
    "kv_heads_per_rank",
    "gather_from_tp",
    "param_groups",
    "reduce_from_tp",
    "scatter_to_tp",
    "tp_rank_size",
]


# --------------------------------------------------------------------------- checks


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def check_divides(tp: int, value: int, what: str) -> None:
    """Raise a ValueError naming ``what`` when the TP size ``tp`` does not divide ``value``."""
    if tp < 1:
        raise ValueError(f"the tensor-parallel size must be >= 1, got {tp}")
    if value % tp:
        raise ValueError(
            f"tensor-parallel size {tp} does not divide {what} = {value}: "
            f"use a TP size among {_divisors(value)}, or change {what} to a multiple of {tp}"
        )


def check_tp_size(
    tp: int, *, world_size: int | None = None, hidden: int | None = None, heads: int | None = None
) -> None:
    """Check a TP size against the world size, the hidden size and the number of heads.

    The world size must be a multiple of tp (the rest is data parallelism), and tp must
    divide the hidden size (each rank a slice of the features) and the number of heads
    (each rank whole heads). Errors say which one failed and what would work.
    """
    if world_size is not None:
        if tp < 1 or world_size % tp:
            raise ValueError(
                f"tensor-parallel size {tp} does not divide the world size {world_size}: "
                f"use a TP size among {_divisors(world_size)} (the rest of the ranks do data "
                f"parallelism), or a world size that is a multiple of {tp}"
            )
    if hidden is not None:
        check_divides(tp, hidden, "the hidden size")
    if heads is not None:
        check_divides(tp, heads, "the number of attention heads")


def kv_heads_per_rank(n_kv_heads: int, tp: int) -> tuple[int, int]:
    """(key/value heads each rank holds, ranks holding a copy of each) under grouped-query
    attention. Up to tp = n_kv_heads the KV heads are split like the query heads; beyond it
    a KV head cannot be cut (its query heads need all of it), so each is replicated on
    tp / n_kv_heads ranks: weights of k and v and the KV cache stop shrinking."""
    if tp <= n_kv_heads:
        check_divides(tp, n_kv_heads, "the number of key/value heads")
        return n_kv_heads // tp, 1
    if tp % n_kv_heads:
        raise ValueError(
            f"tensor-parallel size {tp} is not a multiple of the {n_kv_heads} key/value heads: "
            f"each would be copied a fractional number of times; use a TP size that divides "
            f"{n_kv_heads} or is a multiple of it"
        )
    return 1, tp // n_kv_heads


# --------------------------------------------------------------------------- layers


class ColumnParallelLinear(nn.Module):
    """This rank's out-features of a full ``nn.Linear``: weight [out/N, in], bias [out/N].

    gather_output=False leaves Y_r [..., out/N] (what a row-parallel layer wants next);
    True all-gathers the full Y [..., out]. sync_input_grad=False skips f, for when one f
    already sits in front of several column layers reading the same input (q, k, v).
    """

    def __init__(self, full: nn.Linear, group=None, gather_output=False, log=None, name="col",
                 sync_input_grad=True):  # fmt: skip
        super().__init__()
        rank, world = tp_rank_size(group)
        check_divides(world, full.out_features, f"out_features of {name}")
        self.group, self.log, self.name = group, log, name
        self.gather_output, self.sync_input_grad = gather_output, sync_input_grad
        self.in_features, self.out_features = full.in_features, full.out_features // world
        w = full.weight.detach().chunk(world, dim=0)[rank]  # rows of W = columns of A = W^T
        self.weight = nn.Parameter(w.clone())
        b = full.bias
        self.bias = None if b is None else nn.Parameter(b.detach().chunk(world)[rank].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sync_input_grad:
            x = copy_to_tp(x, self.group, self.log, self.name)
        y = nn.functional.linear(x, self.weight, self.bias)  # [..., out/N]
        return gather_from_tp(y, self.group, self.log, self.name) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """This rank's in-features of a full ``nn.Linear``: weight [out, in/N], full bias.

    input_is_parallel=True: the input is already this rank's slice [..., in/N] (the output
    of a column layer); False: the full input is split here (backward: an all-gather).
    The partial products are summed by g (one all-reduce); the bias is added once, after.
    sequence_parallel=True: g' instead (reduce-scatter: each rank the sum for its tokens);
    the bias is then added to this rank's tokens only, so its gradient is a partial sum over
    the sequence, to be all-reduced like the norms' (it is marked ``sequence_parallel``).
    """

    def __init__(self, full: nn.Linear, group=None, input_is_parallel=True, log=None,
                 name="row", sequence_parallel=False):  # fmt: skip
        super().__init__()
        rank, world = tp_rank_size(group)
        check_divides(world, full.in_features, f"in_features of {name}")
        self.group, self.log, self.name = group, log, name
        self.input_is_parallel, self.sequence_parallel = input_is_parallel, sequence_parallel
        self.in_features, self.out_features = full.in_features // world, full.out_features
        self.weight = nn.Parameter(full.weight.detach().chunk(world, dim=1)[rank].clone())
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone())
        if self.bias is not None and sequence_parallel:
            self.bias.sequence_parallel = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = scatter_to_tp(x, self.group, self.log, self.name)
        partial = nn.functional.linear(x, self.weight)  # X_r A_r: [..., out], a partial sum
        if self.sequence_parallel:
            y = reduce_scatter_to_sp(partial, self.group, self.log, self.name)
        else:
            y = reduce_from_tp(partial, self.group, self.log, self.name)
        return y if self.bias is None else y + self.bias


class ParallelMLP(nn.Module):
    """Megatron's MLP pairing: fc1 column (no gather), activation, fc2 row: one all-reduce
    forward (g after fc2) and one backward (f before fc1).

    ``mlp`` is any module with ``fc1``, ``act`` and ``fc2`` (helpers.parallel.tensor.tp_inference.MLP).
    """

    def __init__(self, mlp: nn.Module, group=None, log=None, name="mlp"):
        super().__init__()
        self.fc1 = ColumnParallelLinear(mlp.fc1, group, log=log, name=f"{name}.fc1")
        self.act = mlp.act
        self.fc2 = RowParallelLinear(mlp.fc2, group, log=log, name=f"{name}.fc2")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class ParallelAttention(nn.Module):
    """Attention split by heads: q, k, v column-parallel (each rank H/N whole heads), o row-
    parallel. One f in front of q, k, v (backward: one all-reduce of dL/dx, not three) and
    one g after o. The attention module's own forward runs unchanged: it reshapes with
    ``view(B, T, -1, head_dim)``, so each rank sees its local number of heads.
    """

    def __init__(self, attn: nn.Module, group=None, log=None, name="attn"):
        super().__init__()
        _, world = tp_rank_size(group)
        check_divides(world, attn.n_heads, f"the number of attention heads of {name}")
        self.inner = attn  # keeps forward(); its q, k, v, o are replaced below
        for p in ("q", "k", "v"):
            col = ColumnParallelLinear(getattr(attn, p), group, log=log, name=f"{name}.{p}",
                                       sync_input_grad=False)  # fmt: skip
            setattr(attn, p, col)
        attn.o = RowParallelLinear(attn.o, group, log=log, name=f"{name}.o")
        self.group, self.log, self.name = group, log, name

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        x = copy_to_tp(x, self.group, self.log, self.name)  # f, shared by q, k and v
        return self.inner(x, *args, **kwargs)


# --------------------------------------------------------------------------- optimizer


def param_groups(params) -> list[dict]:
    """``params`` as optimizer groups of one kind each: the DTensors (what a DTensor plan
    sharded or replicated), then the plain tensors (what it left alone: embeddings, norms...).

        opt = torch.optim.AdamW(TP.param_groups(model.parameters()), lr=1e-3)

    On a GPU, torch's optimizers update a group with one ``foreach`` kernel over all its
    tensors, and that kernel refuses a list that mixes DTensors with plain tensors
    (``got mixed torch.Tensor and DTensor``); on the CPU they loop over the tensors one by
    one, so CPU ranks never meet it. torchtitan meets it neither: its plan makes every
    parameter a DTensor. Groups change nothing else: same settings, same update.
    """
    from torch.distributed.tensor import DTensor

    params = list(params)
    kinds = [[p for p in params if isinstance(p, DTensor)],
             [p for p in params if not isinstance(p, DTensor)]]  # fmt: skip
    return [{"params": kind} for kind in kinds if kind]
