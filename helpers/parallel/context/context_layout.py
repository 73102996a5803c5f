"""Which tokens each rank holds under context parallelism, and the causal work it gets.

A rank's share of the sequence is a sorted 1-D tensor of GLOBAL token positions:

    contiguous_positions(10, 3)   rank 0: 0 1 2 3   rank 1: 4 5 6   rank 2: 7 8 9
                                  (torch.tensor_split: lengths differ by at most one)

With a causal mask, query i sees keys 0..i: the last rank has the most work (its queries
see the whole sequence), the first the least. Load balancing (Llama 3, section 3.3.2 of
its paper; torch's context_parallel; torchtitan) cuts the sequence into 2N chunks and gives
rank r chunks r and 2N-1-r, one from each end:

    balanced_positions(16, 2)     2N = 4 chunks of 4:  [0-3] [4-7] [8-11] [12-15]
                                  rank 0: chunks 0 and 3 -> 0 1 2 3 12 13 14 15
                                  rank 1: chunks 1 and 2 -> 4 5 6 7  8  9 10 11

so every rank holds one early and one late chunk, and with S divisible by 2N every rank has
exactly the same number of (query, key) pairs to compute.

``runs(positions)`` gives the contiguous runs of a share, and ``sub_blocks`` the parts of
one block of keys a rank must compute, with the mask each needs: none (every key is
earlier), a causal one (tiles across the diagonal) or skipped (every key is later).
"""

from __future__ import annotations

import torch

from helpers.parallel.context.online_softmax import causal_mask

__all__ = [
    "balanced_positions",
    "causal_pairs",
    "computed_pairs",
    "contiguous_positions",
    "document_mask",
    "runs",
    "shard",
    "striped_positions",
    "sub_blocks",
    "tile_work",
    "unshard",
]


def _check(seq_len: int, world: int, pieces: int) -> None:
    if world < 1:
        raise ValueError(f"the context-parallel size must be >= 1, got {world}")
    if seq_len < pieces:
        raise ValueError(
            f"a sequence of {seq_len} tokens cannot be cut into {pieces} non-empty chunks: "
            f"use at least {pieces} tokens, or fewer ranks"
        )


def contiguous_positions(seq_len: int, world: int) -> list[torch.Tensor]:
    """Rank r holds the r-th of N contiguous chunks (lengths differ by at most one)."""
    _check(seq_len, world, world)
    return list(torch.tensor_split(torch.arange(seq_len), world))


def balanced_positions(seq_len: int, world: int) -> list[torch.Tensor]:
    """Rank r holds chunks r and 2N-1-r of 2N (load balancing for causal attention)."""
    _check(seq_len, world, 2 * world)
    chunks = torch.tensor_split(torch.arange(seq_len), 2 * world)
    return [torch.cat([chunks[r], chunks[2 * world - 1 - r]]) for r in range(world)]


def striped_positions(seq_len: int, world: int) -> list[torch.Tensor]:
    """Rank r holds tokens r, r + N, r + 2N, ... (striped attention, Brandon et al. 2023)."""
    _check(seq_len, world, world)
    return [torch.arange(r, seq_len, world) for r in range(world)]


def shard(x: torch.Tensor, positions: torch.Tensor, dim: int = -2) -> torch.Tensor:
    """This rank's tokens of a whole-sequence tensor (sequence along ``dim``)."""
    return x.index_select(dim, positions.to(x.device))


def unshard(pieces: list[torch.Tensor], positions: list[torch.Tensor], dim: int = -2):
    """The whole-sequence tensor from every rank's piece (inverse of ``shard``)."""
    whole = torch.cat(pieces, dim=dim)
    order = torch.cat(positions).argsort().to(whole.device)
    return whole.index_select(dim, order)


def runs(positions: torch.Tensor) -> list[tuple[int, int, int]]:
    """Contiguous runs of a sorted share: (local start, local stop, first global position)."""
    pos = positions.tolist()
    out, start = [], 0
    for i in range(1, len(pos) + 1):
        if i == len(pos) or pos[i] != pos[i - 1] + 1:
            out.append((start, i, pos[start]))
            start = i
    return out


def _spans(positions: torch.Tensor, tile: int | None):
    """(local start, local stop, first global position) of each run, cut into tiles."""
    for r0, r1, first in runs(positions):
        step = tile or (r1 - r0)
        for a in range(r0, r1, step):
            yield a, min(a + step, r1), first + (a - r0)


def sub_blocks(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool, tile: int = 128) -> list:
    """(query slice, key slice, mask or None) for every part of a block that has work to do.

    Not causal: the whole block, no mask. Causal: a pair of runs whose keys all come after
    its queries is skipped, one whose keys all come first needs no mask, and where they
    overlap the pair is cut into ``tile`` x ``tile`` tiles, as a fused attention kernel
    does: tiles wholly above the diagonal are skipped, tiles across it get a causal mask
    (from global positions), tiles below it none.
    """
    if not causal:
        return [(slice(None), slice(None), None)]
    work = []
    for q0, q1, q_first in _spans(q_pos, None):
        for k0, k1, k_first in _spans(k_pos, None):
            if k_first > q_first + (q1 - q0) - 1:
                continue  # all in the future: nothing to see
            if k_first + (k1 - k0) - 1 <= q_first:
                work.append((slice(q0, q1), slice(k0, k1), None))  # all in the past
                continue
            for a, b, qa in _spans(q_pos[q0:q1], tile):
                for c, e, kc in _spans(k_pos[k0:k1], tile):
                    if kc > qa + (b - a) - 1:
                        continue
                    qs, ks = slice(q0 + a, q0 + b), slice(k0 + c, k0 + e)
                    diagonal = kc + (e - c) - 1 > qa
                    work.append((qs, ks, causal_mask(q_pos[qs], k_pos[ks]) if diagonal else None))
    return work


def computed_pairs(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool, tile: int = 128) -> int:
    """(query, key) score entries a rank computes for one block (skipped tiles excluded)."""
    total = 0
    for qs, ks, _ in sub_blocks(q_pos, k_pos, causal, tile):
        total += len(q_pos[qs]) * len(k_pos[ks])
    return total


def causal_pairs(positions: list[torch.Tensor]) -> list[int]:
    """Per rank, the (query, key) pairs a causal mask keeps: sum over its queries of (i + 1)."""
    return [int((p + 1).sum()) for p in positions]


def document_mask(doc_ids: torch.Tensor):
    """A mask function (q_pos, k_pos) -> [Lq, Lk] bool for packed documents: causal, and
    only within a query's own document (doc_ids: the document of each global position)."""

    def mask(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        same = doc_ids[q_pos][:, None] == doc_ids[k_pos][None, :]
        return causal_mask(q_pos, k_pos) & same

    return mask


def tile_work(q_pos: torch.Tensor, k_pos: torch.Tensor, mask=causal_mask, tile: int = 128) -> int:
    """Score entries a tiled kernel computes for one block: each ``tile`` x ``tile`` tile of
    the block, in the rank's own order, that holds one visible entry, whole; the others are
    skipped (a fused kernel's causal skip, FlexAttention's block mask). ``mask`` as above."""
    seen = mask(q_pos, k_pos)
    lq, lk = seen.shape
    nq, nk = -(-lq // tile), -(-lk // tile)
    padded = seen
    if (lq, lk) != (nq * tile, nk * tile):
        padded = torch.zeros(nq * tile, nk * tile, dtype=torch.bool)
        padded[:lq, :lk] = seen
    busy = padded.view(nq, tile, nk, tile).any(dim=3).any(dim=1)  # [nq, nk]
    rows = torch.tensor([min(tile, lq - i * tile) for i in range(nq)])
    cols = torch.tensor([min(tile, lk - j * tile) for j in range(nk)])
    return int((busy * rows[:, None] * cols[None, :]).sum())
