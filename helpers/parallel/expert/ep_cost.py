"""What expert parallelism costs: bytes per MoE layer against tensor parallelism and against an
all-gather dispatcher, memory per rank against a dense layer sharded alike, and the load, drops
and traffic of one routing draw (the explorer of notebook 10).

Per MoE layer and rank, forward: two all-to-alls (dispatch, combine), each moving the rank's
T k token rows, of which (N - 1)/N leave the rank when the load is balanced; the backward runs
the two in reverse, as many bytes again. Tensor parallelism of the same layer (every expert's
hidden dimension split over the N ranks, Megatron's MLP) all-reduces the layer's output
[T_group, dim] once forward and once backward; a ring all-reduce sends 2 (N - 1)/N of it per rank.
For the same tokens in the group (T_group = N T), EP sends k/N of TP's bytes. An all-gather
dispatcher (Megatron-Core's "allgather": every rank gathers every token of the group and keeps
the rows of its experts, then a reduce-scatter of the outputs) sends N/k of EP's all-to-all bytes:
less when k > N, which is why it suits a small EP group or a large k.
"""

from __future__ import annotations

import torch

from helpers.parallel.expert.capacity import capacity, keep_mask
from helpers.parallel.expert.router import expert_counts, router_topk

__all__ = ["allgather_bytes", "ep_bytes", "memory_per_rank", "popularity", "routing_draw",
           "tp_bytes"]  # fmt: skip


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


def allgather_bytes(tokens: int, dim: int, ranks: int, bytes_per_value: int = 2) -> dict:
    """Bytes a rank sends per MoE layer with an all-gather dispatcher over ``ranks``: a ring
    all-gather of every rank's [tokens, dim] forward and a reduce-scatter of the outputs, each
    (N - 1) tokens dim values a rank; the backward runs them in reverse. k does not appear."""
    one = (ranks - 1) * tokens * dim * bytes_per_value
    return {"all_gather": one, "forward": 2 * one, "step": 4 * one}


def memory_per_rank(dim: int, hidden: int, n_experts: int, k: int, ranks: int, shared: int = 0,
                    bytes_per_value: int = 2, matrices: int = 3) -> dict:  # fmt: skip
    """Parameter bytes of one feed-forward layer on one of N ranks.

    moe_ep: E/N experts, plus the router and the shared experts, which every EP rank
    replicates; moe_whole: the same layer on one rank (moe_ep at N = 1); dense_sharded: the
    dense layer of the same active FLOPs (width (k + shared) hidden) sharded over the same N
    ranks (FSDP or TP), the fair comparison; dense_whole: that dense layer on one rank.
    Gradients and optimizer states scale alike (mixed-precision Adam: about 8x these bytes
    more), and can be sharded further over the ranks that hold the same experts.
    """
    expert = matrices * dim * hidden * bytes_per_value
    replicated = dim * n_experts * bytes_per_value + shared * expert  # router, shared experts
    active = (k + shared) * expert
    return {"moe_ep": n_experts // ranks * expert + replicated,
            "moe_whole": n_experts * expert + replicated,
            "dense_sharded": active / ranks, "dense_whole": active}  # fmt: skip


def popularity(n_experts: int, seed: int = 0) -> torch.Tensor:
    """A fixed, Zipf-like preference of a router for its experts, in a random order: -log(rank)."""
    g = torch.Generator().manual_seed(seed)
    return -torch.log(torch.arange(1, n_experts + 1, dtype=torch.float))[
        torch.randperm(n_experts, generator=g)
    ]


def routing_draw(tokens: int, n_experts: int, k: int, ranks: int, factor: float | None,
                 skew: float = 1.0, dim: int = 4096, bytes_per_value: int = 2, seed: int = 0,
                 policy: str = "position") -> dict:  # fmt: skip
    """One routing of ``tokens`` tokens (split evenly over the ranks) by a router whose experts
    are unevenly popular: logits = noise + skew x popularity. The capacity (``factor``; None:
    dropless) is per source rank and applied before sending. Returns the load per expert [E]
    (what the router chose), the capacity, the drops per expert, the bytes each rank sends
    each rank in the dispatch [N, N] (kept rows only; diagonal: stays home), and the rows each
    rank receives [N] (its experts' work)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, n_experts, generator=g) + skew * popularity(n_experts, seed)
    routing = router_topk(logits, k)
    load = expert_counts(routing.experts, n_experts)
    per_source = tokens // ranks
    sizes = [per_source + (r < tokens % ranks) for r in range(ranks)]
    cap = None if factor is None else capacity(per_source, k, n_experts, factor)
    kept = keep_mask(routing, n_experts, cap, policy, sizes)
    drops = load - expert_counts(routing.experts[kept].view(-1, 1), n_experts)
    owner = routing.experts // (n_experts // ranks)  # the rank holding each chosen expert
    source = torch.repeat_interleave(torch.arange(ranks), torch.tensor(sizes))[:, None].expand(
        -1, k
    )
    traffic = torch.zeros(ranks, ranks, dtype=torch.long)
    traffic.index_put_((source[kept], owner[kept]), torch.ones(int(kept.sum()), dtype=torch.long),
                       accumulate=True)  # fmt: skip
    return {"load": load, "capacity": cap, "drops": drops, "received_rows": traffic.sum(0),
            "bytes": traffic * dim * bytes_per_value}  # fmt: skip
