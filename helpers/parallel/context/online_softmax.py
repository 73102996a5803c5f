"""Attention one block of keys at a time: a block's output with its log-sum-exp, and the merge.

Softmax attention of queries q [..., Lq, D] over keys k and values v [..., Lk, D]:

    S   = q k^T / sqrt(D)                       scores            [..., Lq, Lk]
    out = softmax(S) v                          output            [..., Lq, D]
    lse = log sum_j exp(S_ij)                   log-sum-exp       [..., Lq]

Cut the keys into two blocks A and B and attend to each alone: (out_A, lse_A), (out_B, lse_B),
each a softmax over its own block only. The attention over both blocks is then

    lse = log(exp(lse_A) + exp(lse_B))                        (torch.logaddexp)
    out = exp(lse_A - lse) out_A + exp(lse_B - lse) out_B     (each block weighted by its share)

exactly, in any order and for any number of blocks: the online softmax (Milakov & Gimelshein
2018) that FlashAttention runs over tiles inside one GPU and ring attention runs over ranks.
A query row that may see no key of a block (causal masking) gets out = 0 and lse = -inf from
that block, so the merge gives the block a weight exp(-inf) = 0.

Causal masking uses the tokens' GLOBAL positions: query at position i sees keys j <= i, so a
rank that holds a slice of the sequence builds its masks from positions, never from tril().
"""

from __future__ import annotations

import math

import torch

__all__ = ["attention", "block_attention", "causal_mask", "merge"]


def causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """[Lq, Lk] bool, True where query position i may see key position j (j <= i)."""
    return q_pos[:, None] >= k_pos[None, :]


def _scores(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    return s if mask is None else s.masked_fill(~mask, float("-inf"))


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """The serial twin: plain softmax attention, softmax(q k^T / sqrt(D), masked) v.

    mask: [Lq, Lk] bool (True = may attend) or None. Every query row must see one key.
    """
    return torch.softmax(_scores(q, k, mask), dim=-1) @ v


def block_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q over ONE block of keys: (out [..., Lq, D], lse [..., Lq]).

    Numerically stable (the row maximum is subtracted before exp); a row that sees no key
    of this block gets out = 0 and lse = -inf instead of NaN. The scores are turned into
    weights in place, so the block holds one [Lq, Lk] tensor at a time.
    """
    s = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-1, -2)
    if mask is not None:
        s.masked_fill_(~mask, float("-inf"))
    row_max = s.detach().amax(dim=-1, keepdim=True)  # a constant for the softmax's gradient
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    p = s.sub_(row_max).exp_()  # masked scores: exp(-inf) = 0
    total = p.sum(dim=-1, keepdim=True)
    out = (p @ v) / torch.where(total > 0, total, torch.ones_like(total))
    lse = (torch.log(total) + row_max).squeeze(-1)  # log 0 = -inf for an empty row
    return out, lse


def merge(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the keys of two blocks from each block's (out, lse): the online softmax.

    Rows that have seen no key in either block stay (0, -inf).
    """
    lse = torch.logaddexp(lse_a, lse_b)
    ref = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))  # no key yet: weights 0
    w_a = torch.exp(lse_a - ref).unsqueeze(-1)
    w_b = torch.exp(lse_b - ref).unsqueeze(-1)
    return w_a * out_a + w_b * out_b, lse
