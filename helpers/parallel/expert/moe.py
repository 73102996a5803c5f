"""The mixture-of-experts layer on one process: the serial twin of expert parallelism.

    routing = router_topk(x @ router_weight, k)    each token's k experts and their gates
                                                   (helpers.parallel.expert.router)
    kept = keep_mask(routing, E, cap)              a capacity, per source (capacity.py)
    out[t] = sum over its kept experts e: gate * expert_e(x[t])

Only k of the E expert feed-forward networks run for a token: the layer holds E times the
parameters of one, and spends k times its FLOPs. ``moe_serial`` runs it expert by expert on
the expert's tokens; ``helpers.parallel.expert.dispatch`` runs the same layer with the experts
spread over ranks, and ``moe_serial(..., sizes=[T] * N)`` is its twin with a capacity (each
rank's tokens are a source with its own capacity). ``moe_counts``: parameters and FLOPs
against a dense layer of the same active FLOPs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from helpers import standin
from helpers.parallel.expert.capacity import keep_mask
from helpers.parallel.expert.router import Routing, expert_counts, router_topk

__all__ = ["Experts", "MoEOutput", "host_counts", "moe_counts", "moe_serial"]


def host_counts(counts: torch.Tensor, total: int) -> list:
    """counts as host numbers, in its shape (split sizes are host numbers: on a GPU this is a
    copy and a sync). On the dry run's fake rank, whose tensors hold no values, an even split
    of total stands in for them: the balanced load, where every rank sends and receives total."""
    if standin.mode() == "fake":
        flat = [
            total // counts.numel() + (i < total % counts.numel()) for i in range(counts.numel())
        ]
        return torch.tensor(flat).view(counts.shape).tolist()
    return counts.tolist()


class Experts(nn.Module):
    """E feed-forward networks (dim -> hidden -> dim, GELU) stored as two stacked weights,
    so that a rank's share is a slice: ``shard(lo, hi)`` holds experts lo..hi-1."""

    def __init__(self, n: int, dim: int, hidden: int, first: int = 0, generator=None,
                 device=None, dtype=None):  # fmt: skip
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.first = first  # the global index of this module's expert 0
        self.w1 = nn.Parameter(torch.empty(n, dim, hidden, **kw))
        self.w2 = nn.Parameter(torch.empty(n, hidden, dim, **kw))
        with torch.no_grad():
            for w, fan_in in ((self.w1, dim), (self.w2, hidden)):
                w.copy_(torch.randn(w.shape, generator=generator).to(w) / math.sqrt(fan_in))

    def __len__(self) -> int:
        return self.w1.shape[0]

    def forward_one(self, j: int, x: torch.Tensor) -> torch.Tensor:
        """Expert j of this module (local index) on the tokens x [n, dim]."""
        return F.gelu(x @ self.w1[j]) @ self.w2[j]

    def shard(self, lo: int, hi: int) -> Experts:
        """A copy of experts lo..hi-1 (global indices), as one rank of expert parallelism holds."""
        part = Experts.__new__(Experts)
        nn.Module.__init__(part)
        part.first = lo
        part.w1 = nn.Parameter(self.w1.detach()[lo - self.first : hi - self.first].clone())
        part.w2 = nn.Parameter(self.w2.detach()[lo - self.first : hi - self.first].clone())
        return part


@dataclass
class MoEOutput:
    """The layer's output [T, dim], its routing, and which assignments were kept [T, k]
    (False: dropped because the expert was full)."""

    out: torch.Tensor
    routing: Routing
    kept: torch.Tensor


def moe_serial(x, router_weight, experts: Experts, k: int, cap: int | None = None, bias=None, *,
               policy: str = "position", sizes: list[int] | None = None, **route) -> MoEOutput:  # fmt: skip
    """The MoE layer on one process: route, keep what the capacity allows, run each expert on
    its tokens, combine.

    x [T, dim], router_weight [dim, E], experts: all E of them. cap, policy, sizes: the
    capacity per source and expert, who is dropped first, and the sources' tokens (see
    ``capacity.keep_mask``); a dropped assignment adds nothing (in a transformer the residual
    connection carries the token on). route: ``router_topk``'s keywords (score, norm, scale).
    """
    n = len(experts)
    routing = router_topk(x @ router_weight, k, bias, **route)
    kept = keep_mask(routing, n, cap, policy, sizes)
    flat = routing.experts.reshape(-1).masked_fill(~kept.reshape(-1), n)  # dropped: expert n
    order = torch.argsort(flat, stable=True)  # by expert, then token; the dropped last
    counts = host_counts(expert_counts(flat, n + 1)[:n], order.numel())
    out = torch.zeros_like(x)
    start = 0
    for e, count in enumerate(counts):
        mine = order[start : start + count]  # flat indices token * k + slot, in token order
        start += count
        tok, slot = mine // k, mine % k
        y = experts.forward_one(e, x[tok])
        out = out.index_add(0, tok, (y * routing.weights[tok, slot].unsqueeze(-1)).to(x.dtype))
    return MoEOutput(out, routing, kept)


def moe_counts(dim: int, hidden: int, n_experts: int, k: int, shared: int = 0,
               matrices: int = 3) -> dict:  # fmt: skip
    """Parameters and forward FLOPs per token of one MoE feed-forward layer (router included)
    against the dense layer of the same active FLOPs (hidden x (k + shared)).

    matrices: 3 for SwiGLU experts (Mixtral, DeepSeek-V3), 2 for a plain MLP.
    """
    expert = matrices * dim * hidden
    router = dim * n_experts
    active = (k + shared) * expert + router
    return {"params": (n_experts + shared) * expert + router, "active_params": active,
            "flops_per_token": 2 * active, "dense_params_same_flops": (k + shared) * expert}  # fmt: skip
