"""The router: which k experts each token goes to, and the gate its expert's output is weighted by.

    scores = softmax(x W_r)            Switch, GShard, Mixtral: probabilities over the E experts
           = sigmoid(x W_r)            DeepSeek-V3: an affinity per expert, independent
    chosen = top_k(scores + bias)      bias (DeepSeek-V3's balancing) steers the choice only
    gate   = scores of the chosen      Switch (k = 1): p_e itself, so the task loss reaches the router
           / their sum (k >= 2)        Mixtral, DeepSeek-V3: renormalised over the k chosen
           x scale                     DeepSeek-V3: routed scaling factor 2.5

Renormalising is a k >= 2 choice: at k = 1 the gate would be p/p = 1 for every token, and
the router would learn from the balance loss alone (``norm=None`` renormalises when k > 1,
as Megatron-Core does for sigmoid scores). Scores and gates stay in float32 (or the logits'
wider type): a bf16 softmax over many experts has 8 bits of mantissa, ties among experts and
coarse gates (Megatron-Core: ``--moe-router-dtype fp32``).

Balance: ``switch_aux_loss`` (Fedus et al. 2021), ``update_bias`` (DeepSeek-V3's
auxiliary-loss-free bias), ``z_loss`` (ST-MoE: keeps the router's logits small), and
``expert_choice`` (Zhou et al. 2022: each expert picks its tokens instead).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Routing", "expert_choice", "expert_counts", "router_topk", "switch_aux_loss",
           "update_bias", "z_loss"]  # fmt: skip


@dataclass
class Routing:
    """Where each token goes. experts [T, k] (long), weights [T, k] (the gates, float32 or
    wider), probs [T, E] (the scores the balance losses use: the softmax; for sigmoid scores
    the affinities normalised over the E experts, as DeepSeek-V3's balance loss has them)."""

    experts: torch.Tensor
    weights: torch.Tensor
    probs: torch.Tensor


def _node_limited(scores: torch.Tensor, k: int, groups: int, group_topk: int) -> torch.Tensor:
    """scores with every expert outside each token's best ``group_topk`` groups set to -inf.
    A group (DeepSeek-V3: the experts of one node) scores the sum of its k/group_topk best."""
    tokens, n_experts = scores.shape
    if n_experts % groups or k % group_topk:
        raise ValueError(f"{n_experts} experts in {groups} groups, top-{k} over {group_topk} "
                         "groups: both must divide evenly")  # fmt: skip
    per_group = scores.view(tokens, groups, -1)
    group_score = per_group.topk(k // group_topk, dim=-1).values.sum(-1)  # [T, groups]
    keep = torch.zeros_like(group_score, dtype=torch.bool)
    keep.scatter_(1, group_score.topk(group_topk, dim=-1).indices, True)
    return per_group.masked_fill(~keep[..., None], float("-inf")).view(tokens, n_experts)


def router_topk(logits: torch.Tensor, k: int, bias: torch.Tensor | None = None, *,
                score: str = "softmax", norm: bool | None = None, scale: float = 1.0,
                groups: int | None = None, group_topk: int | None = None) -> Routing:  # fmt: skip
    """Each token's k experts and their gates (see the module's docstring).

    bias [E]: added to the scores for the choice only. norm: renormalise the k gates (None:
    when k > 1). groups, group_topk: node-limited routing (DeepSeek-V3: 8 groups, 4 of them).
    """
    if score not in ("softmax", "sigmoid"):
        raise ValueError(f"score={score!r}: use 'softmax' or 'sigmoid'")
    wide = torch.promote_types(logits.dtype, torch.float32)  # float32, float64 stays float64
    logits = logits.to(wide)
    scores = torch.softmax(logits, dim=-1) if score == "softmax" else torch.sigmoid(logits)
    choice = scores if bias is None else scores + bias.to(wide)
    if groups is not None:
        choice = _node_limited(choice, k, groups, group_topk or groups)
    experts = choice.topk(k, dim=-1).indices
    picked = scores.gather(-1, experts)
    if (k > 1) if norm is None else norm:
        picked = picked / picked.sum(-1, keepdim=True)
    probs = scores if score == "softmax" else scores / scores.sum(-1, keepdim=True)
    return Routing(experts, picked * scale, probs)


def expert_counts(experts: torch.Tensor, n_experts: int) -> torch.Tensor:
    """How many token-expert assignments each expert got: [E] (long). A scatter-add, not
    bincount, so the size is E whatever the data (fake tensors of the dry run have none)."""
    flat = experts.reshape(-1)
    counts = torch.zeros(n_experts, dtype=torch.long, device=flat.device)
    return counts.scatter_add_(0, flat, torch.ones_like(flat))


def switch_aux_loss(routing: Routing, n_experts: int, group=None, all_tokens=None):
    """E * sum_e f_e P_e (Switch Transformer, eq. 4, for top-k: f_e = count_e / (T k)).

    Balanced routing gives 1; every token on the same k experts with certainty gives E/k (E at
    k = 1). f_e has no gradient (it counts); P_e carries it to the router. Spread over ranks
    (group, or all_tokens given), each rank returns its part of the loss over every rank's
    tokens: f from the all-reduced counts, P from its own tokens over all_tokens; the parts
    sum to the serial loss, and so do their gradients (the scope of the balance: the tokens
    whose counts are summed; Megatron-Core and Qwen's global-batch loss widen it).
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
    the mean load, + rate below it (the sign of the error; section 2.1.2 of the paper, where
    rate = 0.001 for the first 14.3 T tokens)."""
    load = counts.to(bias.dtype)
    return bias + rate * torch.sign(load.mean() - load)


def z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE's router z-loss: the mean of logsumexp(logits)^2 over the tokens (coefficient
    1e-3 in the paper). Large logits make the softmax, and bf16 arithmetic on it, unstable."""
    return torch.logsumexp(logits.float(), dim=-1).square().mean()


def expert_choice(logits: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert-choice routing (Zhou et al. 2022): every expert takes its ``capacity`` tokens of
    highest probability. (tokens [E, capacity], gates [E, capacity]): each expert's load is
    exactly the capacity, a token gets any number of experts (none too), and the choice looks
    at the whole batch, so a token's experts depend on later tokens (a problem for decoding)."""
    probs = torch.softmax(logits.float(), dim=-1)  # [T, E]
    gates, tokens = probs.t().topk(capacity, dim=-1)
    return tokens, gates
