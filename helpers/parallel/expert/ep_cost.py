"""What expert parallelism costs: bytes per MoE layer against tensor parallelism, memory per
rank against a dense layer of the same active FLOPs, and the load, drops and traffic of one
routing draw (the explorer of notebook 10).

Per MoE layer and rank, forward: two all-to-alls (dispatch, combine), each moving the rank's
T k token rows, of which (N - 1)/N leave the rank when the load is balanced; the backward runs
the two in reverse, as many bytes again. Tensor parallelism of the same layer (every expert's
hidden dimension split over the N ranks, Megatron's MLP) all-reduces the layer's output
[T_group, dim] once forward and once backward; a ring all-reduce sends 2 (N - 1)/N of it per rank.
For the same tokens in the group (T_group = N T), EP sends k/N of TP's bytes.
"""

from __future__ import annotations

import torch

from helpers.parallel.expert.moe import capacity, expert_counts, router_topk

__all__ = ["ep_bytes", "memory_per_rank", "routing_draw", "tp_bytes"]


def ep_bytes(tokens: int, dim: int, k: int, ranks: int, bytes_per_value: int = 2) -> dict:
    """Bytes a rank sends per MoE layer with EP over ``ranks``: its ``tokens`` rows, k copies,
    (N - 1)/N of them to other ranks (balanced load). 'all_to_all': one exchange."""
    one = tokens * k * dim * bytes_per_value * (ranks - 1) / ranks
    return {"all_to_all": one, "forward": 2 * one, "step": 4 * one}


def tp_bytes(tokens: int, dim: int, ranks: int, bytes_per_value: int = 2) -> dict:
    """Bytes a rank sends per MoE (or MLP) layer with TP over ``ranks``: ring all-reduces of the
    output [tokens, dim], one forward, one backward (tokens: every token of the TP group)."""
    one = 2 * (ranks - 1) / ranks * tokens * dim * bytes_per_value
    return {"all_reduce": one, "forward": one, "step": 2 * one}


def memory_per_rank(dim: int, hidden: int, n_experts: int, k: int, ranks: int,
                    bytes_per_value: int = 2, matrices: int = 3) -> dict:  # fmt: skip
    """Parameter bytes of one feed-forward layer on one rank: the MoE with EP (E/N experts and
    the router) against the dense layer of the same active FLOPs (hidden k), replicated."""
    expert = matrices * dim * hidden * bytes_per_value
    return {"moe_ep": n_experts // ranks * expert + dim * n_experts * bytes_per_value,
            "moe_whole": n_experts * expert, "dense_same_flops": k * expert}  # fmt: skip


def routing_draw(tokens: int, n_experts: int, k: int, ranks: int, factor: float | None,
                 skew: float = 1.0, dim: int = 4096, bytes_per_value: int = 2,
                 seed: int = 0) -> dict:  # fmt: skip
    """One routing of ``tokens`` tokens (split evenly over the ranks) by a router whose experts
    are unevenly popular: logits = noise + skew x (a fixed popularity, Zipf-like). Returns the
    load per expert [E], the capacity (None without one), the drops per expert, and the bytes
    each rank sends each rank in the dispatch [N, N] (diagonal: stays home)."""
    g = torch.Generator().manual_seed(seed)
    popularity = -torch.log(torch.arange(1, n_experts + 1, dtype=torch.float))
    popularity = popularity[torch.randperm(n_experts, generator=g)]
    logits = torch.randn(tokens, n_experts, generator=g) + skew * popularity
    experts = router_topk(logits, k).experts
    load = expert_counts(experts, n_experts)
    cap = None if factor is None else capacity(tokens, k, n_experts, factor)
    drops = torch.zeros(n_experts, dtype=torch.long) if cap is None else (load - cap).clamp(min=0)
    per = n_experts // ranks
    owner = experts // per  # the rank holding each chosen expert
    source = torch.arange(tokens).repeat_interleave(k).view(tokens, k) * ranks // tokens
    traffic = torch.zeros(ranks, ranks, dtype=torch.long)
    traffic.index_put_((source.reshape(-1), owner.reshape(-1)), torch.ones(tokens * k, dtype=torch.long),
                       accumulate=True)  # fmt: skip
    return {"load": load, "capacity": cap, "drops": drops,
            "bytes": traffic * dim * bytes_per_value}  # fmt: skip
