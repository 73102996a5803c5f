"""Expert parallelism by hand: each of N ranks holds E/N experts, and tokens travel to them.

One MoE layer on rank r, whose tokens x [T, dim] are its own (a data-parallel batch):

    1. route          router_topk: each token's k experts and weights (every rank has the router)
    2. permute        the T k token-expert assignments sorted by expert; expert e lives on
                      rank e // (E/N), so this also groups them by destination rank
    3. count exchange all_to_all_single of the per-expert counts: rank r learns how many rows
                      each rank will send to each of its experts (the split sizes to come)
    4. dispatch       all_to_all_single of the rows themselves, with uneven split sizes
    5. experts        each local expert on its rows (from every rank; none is fine)
    6. combine        the reverse all-to-all (splits swapped) brings each output home, where it
                      is weighted and added into its token's row

``AllToAll`` is an autograd function whose backward is the reverse exchange, so gradients
flow through both all-to-alls: to the experts' weights on their ranks, and back to the
router and the tokens at home. ``ep_moe`` runs the whole layer; ``dispatch``, ``run_experts``
and ``combine`` are its parts. ``reduce_gradients``: EP inside DP, the experts' gradients
summed over the ranks that hold the same experts, everything else over every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as tdist

from helpers.parallel.expert.moe import Experts, Routing, expert_counts, host_counts, router_topk

__all__ = ["AllToAll", "Dispatch", "all_to_all", "combine", "dispatch", "ep_moe",
           "exchange_counts", "expert_range", "permute", "reduce_gradients",
           "run_experts"]  # fmt: skip


class AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits; its gradient goes back by the reverse exchange."""

    @staticmethod
    def forward(ctx, x, out_splits: list[int], in_splits: list[int], group=None):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        tdist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        tdist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def all_to_all(x, out_splits, in_splits, group=None) -> torch.Tensor:
    """Rows x[sum(in_splits[:j]) : ...] go to rank j; out gets out_splits[j] rows from j."""
    return AllToAll.apply(x, list(out_splits), list(in_splits), group)


def expert_range(n_experts: int, rank: int, world: int) -> tuple[int, int]:
    """The experts rank holds, lo..hi-1: E/N contiguous ones (E divisible by N)."""
    if n_experts % world:
        raise ValueError(f"{n_experts} experts do not split evenly over {world} ranks")
    per = n_experts // world
    return rank * per, (rank + 1) * per


def permute(experts: torch.Tensor, n_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, counts): the token-expert assignments (flat index t k + slot) sorted by expert,
    in token order within an expert (a stable sort), and how many each expert got [E]."""
    order = torch.argsort(experts.reshape(-1), stable=True)
    return order, expert_counts(experts, n_experts)


def exchange_counts(counts: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank's counts for this rank's experts: [N, E/N]. counts [E] is cut into N equal
    parts, part j (the counts of rank j's experts) to rank j: one all-to-all of E numbers."""
    n = tdist.get_world_size(group)
    received = torch.empty_like(counts)
    tdist.all_to_all_single(received, counts, group=group)
    return received.view(n, -1)


@dataclass
class Dispatch:
    """What a rank keeps between dispatch and combine: the order its rows were sent in, the
    rows it sent to each rank and received from each, and the received rows per
    (source rank, local expert), N lists of E/N numbers (on the host: split sizes are)."""

    order: torch.Tensor
    send_splits: list[int]
    recv_splits: list[int]
    recv_counts: list[list[int]]


def dispatch(x, routing: Routing, n_experts: int, group=None) -> tuple[torch.Tensor, Dispatch]:
    """Send each token once to every rank holding one of its experts. Returns the rows this
    rank received (by source rank, then local expert, then the sender's token order)."""
    n, k = tdist.get_world_size(group), routing.experts.shape[1]
    order, counts = permute(routing.experts, n_experts)
    recv_counts = exchange_counts(counts, group)
    rows = x[order // k]  # token t k + slot -> token t, grouped by expert
    send_splits = [sum(part) for part in host_counts(counts.view(n, -1), len(rows))]
    recv_counts = host_counts(recv_counts, len(rows))
    recv_splits = [sum(part) for part in recv_counts]
    return all_to_all(rows, recv_splits, send_splits, group), Dispatch(
        order, send_splits, recv_splits, recv_counts
    )


def run_experts(received, recv_counts: list[list[int]], experts: Experts, cap: int | None = None):
    """Each local expert on its rows, in place in the received layout. cap: an expert keeps
    its first cap rows in arrival order (source rank, then token order: the serial order when
    rank r holds the r-th share of the batch) and outputs zeros for the rest."""
    per = len(experts)
    chunks = received.split([n for part in recv_counts for n in part])  # (source, local expert)
    seen = [0] * per
    outs = []
    for i, chunk in enumerate(chunks):
        j = i % per
        keep = len(chunk) if cap is None else max(0, min(len(chunk), cap - seen[j]))
        seen[j] += len(chunk)
        y = experts.forward_one(j, chunk[:keep])
        outs.append(
            torch.cat([y, y.new_zeros(len(chunk) - keep, y.shape[1])]) if keep < len(chunk) else y
        )
    return torch.cat(outs) if outs else received[:0]


def combine(y, routing: Routing, disp: Dispatch, group=None) -> torch.Tensor:
    """The reverse all-to-all brings every expert output home, in the order it was sent; each
    is weighted by its gate and added into its token's row (on the token's rank)."""
    tokens, k = routing.experts.shape
    home = all_to_all(y, disp.send_splits, disp.recv_splits, group)
    gates = routing.weights.reshape(-1)[disp.order].unsqueeze(-1)
    out = home.new_zeros(tokens, home.shape[1])
    return out.index_add(0, disp.order // k, home * gates)


def ep_moe(x, router_weight, experts: Experts, n_experts: int, k: int, group=None,
           cap: int | None = None, bias=None) -> tuple[torch.Tensor, Routing]:  # fmt: skip
    """The MoE layer with expert parallelism: this rank's tokens x [T, dim] in, their outputs
    out; experts: this rank's share (``Experts.shard(*expert_range(E, rank, N))``)."""
    routing = router_topk(x @ router_weight, k, bias)
    received, disp = dispatch(x, routing, n_experts, group)
    y = run_experts(received, disp.recv_counts, experts, cap)
    return combine(y, routing, disp, group), routing


def reduce_gradients(expert_params, other_params, expert_group=None, group=None) -> None:
    """EP inside DP: sum each expert parameter's gradient over expert_group, the ranks that hold
    the same experts (one per EP group: the data-parallel group of the experts), and every
    other parameter's (router, attention, norms) over group (every rank)."""
    for p in expert_params:
        tdist.all_reduce(p.grad, group=expert_group)
    for p in other_params:
        tdist.all_reduce(p.grad, group=group)
