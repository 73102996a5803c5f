"""The capacity dispatcher with static shapes (GShard, Switch; Megatron-Core's drop-and-pad).

Every rank sends every expert exactly C rows, C the capacity per source: its kept assignments
in their places (``capacity.slot_in_expert``: 0 .. C-1), zeros in the places left empty. So
every all-to-all moves E C rows of a rank, E/N C to each rank, whatever the routing:

    send   [E, C, dim]          expert-major, C places each (zeros where no token came)
    recv   [N, E/N, C, dim]     from each source, for each local expert
    experts [E/N, N C, dim]     one batched product per matrix (torch.bmm), static shapes

No count exchange, and no split size to read: the dropless dispatcher must copy the counts to
the host before its all-to-all (on a GPU, a wait for every queued kernel), which a CUDA graph or
a compiled step cannot contain; here every size is known before the step. The price: the drops,
and the padding's bytes and FLOPs when the load is below C.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as tdist
import torch.nn.functional as F

from helpers.parallel.expert.capacity import slot_in_expert
from helpers.parallel.expert.dispatch import all_to_all
from helpers.parallel.expert.moe import Experts
from helpers.parallel.expert.router import Routing

__all__ = ["Padded", "combine_padded", "dispatch_padded", "run_experts_padded"]


@dataclass
class Padded:
    """Where each assignment was placed: index [T, k] into the E C places (E C: dropped),
    and the capacity C."""

    index: torch.Tensor
    cap: int


def dispatch_padded(x, routing: Routing, n_experts: int, cap: int, policy: str = "position",
                    group=None) -> tuple[torch.Tensor, Padded]:  # fmt: skip
    """This rank's rows in E C fixed places, sent with one all-to-all of equal splits. Returns
    the rows received, [N E/N C, dim] (source, local expert, place), and the placement."""
    tokens, k = routing.experts.shape
    n = tdist.get_world_size(group)
    place = slot_in_expert(routing, n_experts, policy)
    index = torch.where(place < cap, routing.experts * cap + place, n_experts * cap)
    rows = x.repeat_interleave(k, dim=0)  # assignment t k + s carries token t
    send = x.new_zeros(n_experts * cap + 1, x.shape[1]).index_add(0, index.reshape(-1), rows)
    splits = [n_experts // n * cap] * n  # known before the step: nothing read on the host
    return all_to_all(send[:-1], splits, splits, group), Padded(index, cap)


def run_experts_padded(received: torch.Tensor, experts: Experts, sources: int) -> torch.Tensor:
    """The local experts on their N C places each, as batched products: [E/N, N C, dim]."""
    local, dim = len(experts), received.shape[1]
    rows = received.view(sources, local, -1, dim).transpose(0, 1).reshape(local, -1, dim)
    y = torch.bmm(F.gelu(torch.bmm(rows, experts.w1)), experts.w2)
    return y.view(local, sources, -1, dim).transpose(0, 1).reshape(-1, dim)


def combine_padded(y, routing: Routing, plan: Padded, group=None) -> torch.Tensor:
    """The reverse all-to-all (equal splits) brings the E C outputs home; each kept assignment
    takes its place's output, weighted by its gate, into its token's row."""
    tokens, k = routing.experts.shape
    splits = [len(y) // tdist.get_world_size(group)] * tdist.get_world_size(group)
    home = all_to_all(y, splits, splits, group)
    home = torch.cat([home, home.new_zeros(1, home.shape[1])])  # the dropped: place E C, zeros
    picked = home[plan.index.reshape(-1)] * routing.weights.reshape(-1, 1).to(home.dtype)
    out = home.new_zeros(tokens, home.shape[1])
    return out.index_add(0, torch.arange(tokens, device=y.device).repeat_interleave(k), picked)
