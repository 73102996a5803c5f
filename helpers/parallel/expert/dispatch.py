"""Expert parallelism by hand: each of N ranks holds E/N experts, and tokens travel to them.

One MoE layer on rank r, whose tokens x [T, dim] are its own (a data-parallel batch):

    1. route          router_topk: each token's k experts and gates (every rank has the router)
    2. permute        the T k token-expert assignments sorted by expert; expert e lives on
                      rank e // (E/N), so this also groups them by destination rank. One row
                      per assignment: a token whose two experts live on one rank goes there
                      twice (DeepSeek-V3's DeepEP sends a token once per node instead)
    3. count exchange all_to_all_single of the per-expert counts: rank r learns how many rows
                      each rank will send to each of its experts (the split sizes to come)
    4. dispatch       all_to_all_single of the rows themselves, with uneven split sizes
    5. experts        each local expert on its rows (from every rank; none is fine)
    6. combine        the reverse all-to-all (splits swapped) brings each output home, where it
                      is weighted by its gate and added into its token's row

With a capacity (``kept``, from ``capacity.keep_mask`` on the sending rank) the dropped
assignments are left out before step 3: they are never sent. ``weight_at="expert"`` weights at
the expert instead of at home, as Megatron-Core's alltoall dispatcher does: the gates travel
with the rows (one more all-to-all, of T k numbers) and the outputs come home weighted.

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

from helpers.parallel.expert.capacity import keep_mask
from helpers.parallel.expert.moe import Experts, host_counts
from helpers.parallel.expert.router import Routing, expert_counts, router_topk

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


def permute(experts: torch.Tensor, n_experts: int, kept: torch.Tensor | None = None):
    """(order, counts): the token-expert assignments (flat index t k + slot) sorted by expert,
    in token order within an expert (a stable sort), the dropped ones (kept False) last; and
    how many each expert got [E], the dropped not counted."""
    flat = experts.reshape(-1)
    if kept is not None:
        flat = flat.masked_fill(~kept.reshape(-1), n_experts)  # dropped: after every expert
    return torch.argsort(flat, stable=True), expert_counts(flat, n_experts + 1)[:n_experts]


def exchange_counts(counts: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank's counts for this rank's experts: [N, E/N]. counts [E] is cut into N equal
    parts, part j (the counts of rank j's experts) to rank j: one all-to-all of E numbers."""
    n = tdist.get_world_size(group)
    received = torch.empty_like(counts)
    tdist.all_to_all_single(received, counts, group=group)
    return received.view(n, -1)


@dataclass
class Dispatch:
    """What a rank keeps between dispatch and combine: the order its rows were sent in (the
    kept assignments only), the rows it sent to each rank and received from each, the received
    rows per (source rank, local expert), N lists of E/N numbers (on the host: split sizes
    are), and with weight_at="expert" the gates that came with the received rows."""

    order: torch.Tensor
    send_splits: list[int]
    recv_splits: list[int]
    recv_counts: list[list[int]]
    gates: torch.Tensor | None = None


def dispatch(x, routing: Routing, n_experts: int, group=None, kept: torch.Tensor | None = None,
             send_gates: bool = False) -> tuple[torch.Tensor, Dispatch]:  # fmt: skip
    """Send one row per kept token-expert assignment to the rank holding its expert. Returns
    the rows this rank received (by source rank, then local expert, then the sender's token
    order). send_gates: the gate of each row travels with it (for weighting at the expert)."""
    n, k = tdist.get_world_size(group), routing.experts.shape[1]
    order, counts = permute(routing.experts, n_experts, kept)
    recv_counts = exchange_counts(counts, group)
    send_splits = [sum(part) for part in host_counts(counts.view(n, -1), order.numel())]
    order = order[: sum(send_splits)]  # the dropped assignments stay home
    recv_counts = host_counts(recv_counts, order.numel())
    recv_splits = [sum(part) for part in recv_counts]
    received = all_to_all(x[order // k], recv_splits, send_splits, group)
    gates = None
    if send_gates:
        gates = all_to_all(routing.weights.reshape(-1)[order], recv_splits, send_splits, group)
    return received, Dispatch(order, send_splits, recv_splits, recv_counts, gates)


def run_experts(received, recv_counts: list[list[int]], experts: Experts):
    """Each local expert on its rows, in place in the received layout: one small product per
    (source rank, local expert) chunk, N E/N of them (``grouped.run_grouped`` regroups the rows
    by expert first, as Megatron-Core and torchtitan do, and runs one grouped product)."""
    per = len(experts)
    chunks = received.split([c for part in recv_counts for c in part])  # (source, local expert)
    outs = [experts.forward_one(i % per, chunk) for i, chunk in enumerate(chunks)]
    return torch.cat(outs) if outs else received[:0]


def combine(y, routing: Routing, disp: Dispatch, group=None, weighted: bool = False):
    """The reverse all-to-all brings every expert output home, in the order it was sent; each
    is weighted by its gate (unless ``weighted``: already done at the expert) and added into
    its token's row (on the token's rank). A dropped assignment adds nothing."""
    tokens, k = routing.experts.shape
    home = all_to_all(y, disp.send_splits, disp.recv_splits, group)
    if not weighted:
        home = home * routing.weights.reshape(-1)[disp.order].unsqueeze(-1).to(home.dtype)
    out = home.new_zeros(tokens, home.shape[1])
    return out.index_add(0, disp.order // k, home)


def ep_moe(x, router_weight, experts: Experts, n_experts: int, k: int, group=None,
           cap: int | None = None, bias=None, *, policy: str = "position",
           weight_at: str = "home", **route) -> tuple[torch.Tensor, Routing]:  # fmt: skip
    """The MoE layer with expert parallelism: this rank's tokens x [T, dim] in, their outputs
    out; experts: this rank's share (``Experts.shard(*expert_range(E, rank, N))``). cap: per
    source (this rank's tokens) and expert, applied here before sending. weight_at: "home"
    (the gates stay on the token's rank) or "expert" (Megatron-Core's choice)."""
    if weight_at not in ("home", "expert"):
        raise ValueError(f"weight_at={weight_at!r}: use 'home' or 'expert'")
    routing = router_topk(x @ router_weight, k, bias, **route)
    kept = None if cap is None else keep_mask(routing, n_experts, cap, policy)
    received, disp = dispatch(x, routing, n_experts, group, kept, send_gates=weight_at == "expert")
    y = run_experts(received, disp.recv_counts, experts)
    if disp.gates is not None:
        y = y * disp.gates.unsqueeze(-1).to(y.dtype)
    out = combine(y, routing, disp, group, weighted=disp.gates is not None)
    return out.to(x.dtype), routing


def reduce_gradients(expert_params, other_params, expert_group=None, group=None) -> None:
    """EP inside DP: sum each expert parameter's gradient over expert_group, the ranks that hold
    the same experts (one per EP group: the data-parallel group of the experts), and every
    other parameter's (router, attention, norms) over group (every rank)."""
    for p in expert_params:
        tdist.all_reduce(p.grad, group=expert_group)
    for p in other_params:
        tdist.all_reduce(p.grad, group=group)
