"""The vocabulary split over the TP group: the embedding, the output layer and the loss.

A language model's first and last layers are as wide as its vocabulary V (32,000 for Llama 2,
128,256 for Llama 3). Replicating them costs every rank 2 V d parameters, and a replicated
output layer materialises all V logits of every token on every rank. Megatron-LM splits both
by vocabulary rows, rank r owning token ids [r V/N, (r+1) V/N):

    VocabParallelEmbedding   each rank looks up the tokens it owns (zeros for the others);
                             g (all-reduce) sums: every token's row comes from one rank
    the output layer         column-parallel without gather: logits [B, T, V/N] per rank
    vocab_parallel_cross_entropy   the softmax over the whole vocabulary without gathering
                             it: three all-reduces of one number per token

        loss_i = log sum_v exp(z_iv - m_i) - (z_i,target - m_i),   m_i = max_v z_iv
          m_i          all-reduce MAX of each rank's maximum over its V/N logits
          sum exp      all-reduce SUM of each rank's partial sum
          z_target     all-reduce SUM: the one rank that owns the target gives its logit

    backward: dL/dz_iv = softmax_iv - [v = target_i], on each rank's own V/N columns: no message.

The same with DTensor: ``RowwiseParallel`` on an ``nn.Embedding`` shards its rows (the
vocabulary), ``ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)`` on the
output layer, and ``torch.distributed.tensor.parallel.loss_parallel()`` around the loss.
"""

from __future__ import annotations

import torch
import torch.distributed as tdist
from torch import nn

from helpers.parallel.tensor.tp import check_divides
from helpers.parallel.tensor.tp_comm import CommLog, reduce_from_tp, tp_rank_size

__all__ = ["VocabParallelEmbedding", "vocab_parallel_cross_entropy", "vocab_range"]


def vocab_range(vocab: int, group=None) -> tuple[int, int]:
    """[start, end) of the token ids this rank owns."""
    rank, world = tp_rank_size(group)
    check_divides(world, vocab, "the vocabulary size")
    per = vocab // world
    return rank * per, (rank + 1) * per


class VocabParallelEmbedding(nn.Module):
    """This rank's rows [start, end) of a full ``nn.Embedding``; the output is whole."""

    def __init__(self, full: nn.Embedding, group=None, log: CommLog | None = None,
                 name="embed"):  # fmt: skip
        super().__init__()
        self.start, self.end = vocab_range(full.num_embeddings, group)
        self.weight = nn.Parameter(full.weight.detach()[self.start : self.end].clone())
        self.group, self.log, self.name = group, log, name

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mine = (tokens >= self.start) & (tokens < self.end)
        local = torch.where(mine, tokens - self.start, 0)  # any valid row: masked below
        rows = nn.functional.embedding(local, self.weight) * mine.unsqueeze(-1)
        return reduce_from_tp(rows, self.group, self.log, self.name)  # g: one rank per token


def _all_reduce(x, op, group, log, layer):
    tdist.all_reduce(x, op=op, group=group)
    if log is not None:
        log.record("all_reduce", "forward", layer, x.numel() * x.element_size(),
                   tp_rank_size(group)[1])  # fmt: skip
    return x


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, start, group, log):
        # logits [n, V/N]: this rank's columns; targets [n]: token ids of the whole vocabulary
        m = logits.detach().max(dim=-1).values
        _all_reduce(m, tdist.ReduceOp.MAX, group, log, "loss: max")
        z = logits - m.unsqueeze(-1)  # the global max: exp never overflows on any rank
        e = z.exp()
        total = _all_reduce(e.sum(dim=-1), tdist.ReduceOp.SUM, group, log, "loss: sum exp")
        mine = (targets >= start) & (targets < start + logits.shape[-1])
        local = torch.where(mine, targets - start, 0)
        picked = z.gather(-1, local.unsqueeze(-1)).squeeze(-1) * mine
        picked = _all_reduce(picked, tdist.ReduceOp.SUM, group, log, "loss: target logit")
        ctx.save_for_backward(e / total.unsqueeze(-1), mine, local)
        return total.log() - picked  # [n]: each token's loss, the same on every rank

    @staticmethod
    def backward(ctx, grad):
        softmax, mine, local = ctx.saved_tensors
        g = softmax.clone()
        rows = torch.arange(g.shape[0], device=g.device)
        g[rows, local] -= mine.to(g.dtype)  # minus one-hot, where this rank owns the target
        return g * grad.unsqueeze(-1), None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, group=None,
                                 log: CommLog | None = None) -> torch.Tensor:  # fmt: skip
    """Mean cross-entropy of ``logits`` [..., V/N] (this rank's vocabulary columns) against
    ``targets`` [...] (ids in the whole vocabulary), equal to F.cross_entropy of the
    gathered logits, without gathering them."""
    rank, world = tp_rank_size(group)
    start = rank * logits.shape[-1]
    flat, t = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    return _VocabParallelCrossEntropy.apply(flat, t, start, group, log).mean()
