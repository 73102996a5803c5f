"""Ulysses (all-to-all over the heads) equals one process's attention; the layouts and the
tile counts notebook 09 compares the ring's layouts with (striped, two ends, a document mask)."""

from __future__ import annotations

import torch

from helpers import launch
from helpers.parallel.context import context_layout as CL
from helpers.parallel.context import online_softmax as OS
from helpers.parallel.context import ulysses as U


def _ulysses(d, q, k, v):
    pos = CL.contiguous_positions(q.shape[-2], d.world_size)
    mine = [CL.shard(t, pos[d.rank]) for t in (q, k, v)]
    back = U.heads_to_sequence(U.sequence_to_heads(mine[0]))  # the two exchanges are inverses
    outs = {c: U.ulysses_attention(*mine, causal=c) for c in (True, False)}
    return outs, (back - mine[0]).abs().max().item()


def test_ulysses_equals_serial_attention_on_4_ranks():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 8, 32, 16, generator=g) for _ in range(3))
    pos = CL.contiguous_positions(32, 4)
    out = launch.spawn(_ulysses, 4, args=(q, k, v))
    assert max(o[1] for o in out) == 0
    for causal in (True, False):
        mask = CL.causal_mask(torch.arange(32), torch.arange(32)) if causal else None
        err = (
            (CL.unshard([o[0][causal] for o in out], pos) - OS.attention(q, k, v, mask)).abs().max()
        )
        assert err < 1e-5


def test_bytes_ulysses_against_the_ring():
    # no GQA: the same at N = 2, Ulysses less beyond; Llama-3-8B's GQA (d_kv = d/4): 5/N
    assert U.ulysses_bytes(8192, 4096, 4096, 2) == U.ring_bytes(8192, 4096, 2)
    assert U.ulysses_bytes(8192, 4096, 1024, 8) / U.ring_bytes(8192, 1024, 8) == 5 / 8


def test_striped_and_two_ends_balance_each_ring_step_and_a_document_mask_breaks_two_ends():
    seq, n, tile = 1024, 4, 32
    docs = torch.zeros(seq, dtype=torch.long)
    for cut in (100, 230, 500, 610, 900):
        docs[cut:] += 1

    def slowest_steps(layout, mask):  # the ring waits for its slowest rank at every step
        pos = layout(seq, n)
        work = [
            [CL.tile_work(pos[r], pos[(r - s) % n], mask, tile) for r in range(n)] for s in range(n)
        ]
        return sum(max(w) for w in work) / (sum(map(sum, work)) / n), sum(map(sum, work))

    assert CL.striped_positions(10, 3)[1].tolist() == [1, 4, 7]
    causal = {name: slowest_steps(getattr(CL, f"{name}_positions"), CL.causal_mask)[0]
              for name in ("contiguous", "balanced", "striped")}  # fmt: skip
    assert causal["contiguous"] > 1.5 and causal["balanced"] < 1.05 and causal["striped"] < 1.05
    doc = CL.document_mask(docs)
    two_ends, two_ends_total = slowest_steps(CL.balanced_positions, doc)
    striped, striped_total = slowest_steps(CL.striped_positions, doc)
    assert two_ends > 1.2 and striped < 1.05 and striped_total > 1.2 * two_ends_total
