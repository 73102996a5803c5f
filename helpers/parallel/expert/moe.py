"""The mixture-of-experts layer on one process: the serial twin of expert parallelism.

    logits = x @ router_weight                     [T, E]: one score per token and expert
    routing = router_topk(logits, k)               the k best experts of each token, and their
                                                   softmax weights renormalised over those k
    out[t] = sum over its k experts e: weight * expert_e(x[t])

Only k of the E expert feed-forward networks run for a token: the layer holds E times the
parameters of one, and spends k times its FLOPs. ``moe_serial`` runs it token by token
per expert (in token order, so a capacity drops the latest tokens an expert was given);
``helpers.parallel.expert.dispatch`` runs the same layer with the experts spread over ranks.

Balance: ``switch_aux_loss`` (Fedus et al. 2021: E * sum_e f_e P_e, f_e the share of the
token-expert assignments that went to e, P_e the mean router probability of e; 1 when
perfectly balanced) and ``update_bias`` (DeepSeek-V3, 2024: a per-expert bias added to the
scores for the choice only, nudged down for an overloaded expert and up for an idle one
after each step, with no loss term at all).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from helpers import standin

__all__ = ["Experts", "MoEOutput", "Routing", "capacity", "expert_counts", "host_counts", "moe_counts",
           "moe_serial", "router_topk", "switch_aux_loss", "update_bias"]  # fmt: skip


@dataclass
class Routing:
    """Where each token goes. experts [T, k] (long), weights [T, k] (sum 1 per token),
    probs [T, E] (the router's softmax over every expert, for the auxiliary loss)."""

    experts: torch.Tensor
    weights: torch.Tensor
    probs: torch.Tensor


def router_topk(logits: torch.Tensor, k: int, bias: torch.Tensor | None = None) -> Routing:
    """The k experts with the highest probability, their weights renormalised over the k.

    bias (DeepSeek-V3's auxiliary-loss-free balancing): added to the probabilities for the
    choice only; the weights stay the router's own probabilities, so the bias steers where
    tokens go without changing what the experts' outputs are weighted by.
    """
    probs = torch.softmax(logits.float(), dim=-1).to(logits.dtype)
    scores = probs if bias is None else probs + bias.to(probs.dtype)
    experts = scores.topk(k, dim=-1).indices
    picked = probs.gather(-1, experts)
    return Routing(experts, picked / picked.sum(-1, keepdim=True), probs)


def expert_counts(experts: torch.Tensor, n_experts: int) -> torch.Tensor:
    """How many token-expert assignments each expert got: [E] (long). A scatter-add, not
    bincount, so the size is E whatever the data (fake tensors of the dry run have none)."""
    flat = experts.reshape(-1)
    counts = torch.zeros(n_experts, dtype=torch.long, device=flat.device)
    return counts.scatter_add_(0, flat, torch.ones_like(flat))


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


def capacity(tokens: int, k: int, n_experts: int, factor: float) -> int:
    """Switch Transformer's expert capacity: factor x the balanced share, tokens k / E."""
    return math.ceil(factor * tokens * k / n_experts)


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


def moe_serial(x, router_weight, experts: Experts, k: int, cap: int | None = None,
               bias=None) -> MoEOutput:  # fmt: skip
    """The MoE layer on one process: route, run each expert on its tokens, combine.

    x [T, dim], router_weight [dim, E], experts: all E of them. cap: each expert takes at
    most this many assignments, the first ones in token order; the others are dropped (their
    share of the output is zero: in a transformer the residual connection carries the token on).
    """
    routing = router_topk(x @ router_weight, k, bias)
    order = torch.argsort(routing.experts.reshape(-1), stable=True)  # by expert, then token
    counts = host_counts(expert_counts(routing.experts, len(experts)), order.numel())
    out = torch.zeros_like(x)
    kept = torch.ones_like(routing.experts, dtype=torch.bool)
    start = 0
    for e, n in enumerate(counts):
        mine = order[start : start + n]  # flat indices token * k + slot, in token order
        start += n
        if cap is not None:
            kept.view(-1)[mine[cap:]] = False
            mine = mine[:cap]
        tok, slot = mine // k, mine % k
        y = experts.forward_one(e, x[tok])
        out = out.index_add(0, tok, y * routing.weights[tok, slot].unsqueeze(-1))
    return MoEOutput(out, routing, kept)


def switch_aux_loss(routing: Routing, n_experts: int, group=None, all_tokens=None):
    """E * sum_e f_e P_e (Switch Transformer, eq. 4, for top-k: f_e = count_e / (T k)).

    Balanced routing gives 1; all tokens on one expert with certainty gives E. f_e has no
    gradient (it counts); P_e carries it to the router. Spread over ranks (group, or
    all_tokens given), each rank returns its part of the loss over every rank's tokens: f
    from the all-reduced counts, P from its own tokens over all_tokens; the parts sum to
    the serial loss, and so do their gradients.
    """
    import torch.distributed as tdist

    tokens, k = routing.experts.shape
    counts = expert_counts(routing.experts, n_experts).to(routing.probs.dtype)
    total = tokens if all_tokens is None else all_tokens
    if group is not None or all_tokens is not None:
        tdist.all_reduce(counts, group=group)
    f = counts / (total * k)
    return n_experts * (f * routing.probs.sum(0) / total).sum()


def update_bias(bias: torch.Tensor, counts: torch.Tensor, rate: float) -> torch.Tensor:
    """DeepSeek-V3's auxiliary-loss-free balancing, one step: b_e - rate for an expert above
    the mean load, + rate below it (the sign of the error; section 2.1.2 of the paper)."""
    load = counts.to(bias.dtype)
    return bias + rate * torch.sign(load.mean() - load)


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
