"""DeepSpeed-Ulysses: context parallelism by an all-to-all over the heads.

Jacobs et al. 2023 (DeepSpeed-Ulysses). Each rank holds its tokens of every head; one
all-to-all turns that into ALL tokens of H/N heads, attention runs on whole sequences (any
kernel, any mask: nothing to merge), and a second all-to-all brings the output back:

    rank r:  q, k, v [B, H, S/N, D]  --all-to-all-->  [B, H/N, S, D]   attention of its heads
             out     [B, H, S/N, D]  <--all-to-all--  [B, H/N, S, D]

Each all-to-all keeps 1/N of a tensor and sends the rest: per rank and layer forward, q and
the output (S/N tokens x the width d) and k and v (S/N x d_kv, smaller with grouped-query
attention), each (N-1)/N sent, where the ring sends N-1 K/V blocks of S/N tokens. Ulysses' bytes per rank fall as 1/N when N grows with S; the
ring's stay. Its limit: N must divide the heads (the KV heads with grouped-query attention,
unless they are replicated), so it stops at 8 to 32 ranks, and the all-to-all crosses every
link at once instead of the ring's neighbour links. Shares are contiguous and equal here
(``context_layout.contiguous_positions`` with S divisible by N); a causal mask is then the
whole sequence's, so the kernel's own ``is_causal`` does it and no load balancing is needed:
every rank computes its heads over the whole triangle.

    ulysses_attention(q, k, v, causal=False, group=None)   this rank's output, [B, H, S/N, D]
    ulysses_bytes(seq, width, kv_width, world, value_bytes=2)   bytes one rank sends per layer
    ring_bytes(seq, kv_width, world, value_bytes=2)             the ring's, for comparison
"""

from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F

__all__ = [
    "heads_to_sequence",
    "ring_bytes",
    "sequence_to_heads",
    "ulysses_attention",
    "ulysses_bytes",
]


def _exchange(x: torch.Tensor, group=None) -> torch.Tensor:
    """all_to_all_single along dim 0 (N equal parts): part j to rank j, part i from rank i."""
    x = x.contiguous()  # first: empty_like would copy a transposed view's strides
    out = torch.empty_like(x)
    tdist.all_to_all_single(out, x, group=group)
    return out


def sequence_to_heads(x: torch.Tensor, group=None) -> torch.Tensor:
    """[B, H, L, D] (this rank's L tokens, every head) -> [B, H/N, N*L, D] (its heads, every token)."""
    n = tdist.get_world_size(group)
    b, h, length, d = x.shape
    if h % n:
        raise ValueError(f"Ulysses needs the heads ({h}) divisible by the ranks ({n})")
    parts = x.reshape(b, n, h // n, length, d).transpose(0, 1)  # [N (head group), B, H/N, L, D]
    got = _exchange(parts, group)  # [N (token block), B, H/N, L, D]
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // n, n * length, d)


def heads_to_sequence(x: torch.Tensor, group=None) -> torch.Tensor:
    """The inverse: [B, H/N, N*L, D] -> [B, H, L, D]."""
    n = tdist.get_world_size(group)
    b, hn, s, d = x.shape
    parts = x.reshape(b, hn, n, s // n, d).permute(2, 0, 1, 3, 4)  # [N (token block), B, H/N, L, D]
    got = _exchange(parts, group)  # [N (head group), B, H/N, L, D]
    return got.transpose(0, 1).reshape(b, n * hn, s // n, d)


def ulysses_attention(q, k, v, causal: bool = False, group=None) -> torch.Tensor:
    """This rank's attention output for its contiguous tokens: [B, H, L, D] in and out."""
    whole = [sequence_to_heads(t, group) for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*whole, is_causal=causal)
    return heads_to_sequence(out, group)


def ulysses_bytes(seq: int, width: int, kv_width: int, world: int, value_bytes: int = 2) -> float:
    """Bytes one rank sends per layer forward: q and the output (width), k and v (kv_width),
    (N-1)/N of each."""
    return (2 * width + 2 * kv_width) * (seq / world) * value_bytes * (world - 1) / world


def ring_bytes(seq: int, kv_width: int, world: int, value_bytes: int = 2) -> float:
    """Bytes one rank sends per layer forward in a ring: N-1 K/V blocks of S/N tokens."""
    return (world - 1) * 2 * (seq / world) * kv_width * value_bytes
