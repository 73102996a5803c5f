"""Context parallelism by all-gathering K and V (the Llama 3 approach).

Each rank keeps its own queries and gathers every rank's keys and values once, then computes
its queries' attention over the whole sequence:

    rank r:  q_r [.., L_r, D]      K, V = all_gather(k_r, v_r)  [.., S, D]      out_r = attn(q_r, K, V)

Simple and flexible (any mask: the rank sees every key position), and with grouped-query
attention K and V are several times smaller than Q, so the gather is cheap next to the
O(S^2) attention (Llama 3 paper, section 3.3.2). The price: every rank holds the whole
sequence's K and V, and the gather is not hidden behind compute.

gloo's and NCCL's all_gather want equal sizes, so shares of unequal length are padded to the
longest one and cut back after the gather. The gather is differentiable: its backward is a
reduce-scatter (each rank gets back the sum, over all ranks, of the gradients of its own
K and V), which is what FSDP does with weights.
"""

from __future__ import annotations

import torch
import torch.distributed as tdist

from helpers.parallel.context.online_softmax import block_attention, causal_mask

__all__ = ["GatherSequence", "allgather_attention"]


def _pad_to(x: torch.Tensor, length: int) -> torch.Tensor:
    extra = length - x.shape[-2]
    return x if extra == 0 else torch.cat([x, x.new_zeros(*x.shape[:-2], extra, x.shape[-1])], -2)


class GatherSequence(torch.autograd.Function):
    """All-gather along the sequence (dim -2), shares of unequal ``lengths``; backward: reduce-scatter."""

    @staticmethod
    def forward(ctx, x, lengths, group=None):
        ctx.lengths, ctx.group = lengths, group
        longest = max(lengths)
        pieces = [x.new_empty(*x.shape[:-2], longest, x.shape[-1]) for _ in lengths]
        tdist.all_gather(pieces, _pad_to(x, longest).contiguous(), group=group)
        return torch.cat([p[..., :n, :] for p, n in zip(pieces, lengths, strict=True)], dim=-2)

    @staticmethod
    def backward(ctx, grad):
        lengths, group = ctx.lengths, ctx.group
        longest, rank = max(lengths), tdist.get_rank(group)
        parts = [_pad_to(g, longest).contiguous() for g in grad.split(lengths, dim=-2)]
        mine = parts[0].new_empty(parts[0].shape)
        tdist.reduce_scatter(mine, parts, group=group)  # sum of every rank's dL/d(my K)
        return mine[..., : lengths[rank], :], None, None


def allgather_attention(q, k, v, positions, causal=False, group=None) -> torch.Tensor:
    """This rank's attention over the whole sequence after all-gathering K and V.

    q, k, v: [..., L_r, D], this rank's tokens; positions: every rank's global positions.
    """
    rank = tdist.get_rank(group)
    lengths = [len(p) for p in positions]
    kv = GatherSequence.apply(torch.stack([k, v]), lengths, group)  # one gather for K and V
    mask = None
    if causal:
        mask = causal_mask(positions[rank], torch.cat(positions)).to(q.device)
    return block_attention(q, kv[0], kv[1], mask)[0]
