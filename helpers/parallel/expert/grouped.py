"""The experts after the all-to-all: regroup the received rows by expert, then one grouped GEMM.

The rows arrive rank-major, in (source rank, local expert) chunks:

    received:  [src 0: e0 e1 | src 1: e0 e1 | src 2: e0 e1 | src 3: e0 e1]   N E/N chunks
    regrouped: [e0: src 0 1 2 3 (pad) | e1: src 0 1 2 3 (pad)]             E/N groups

``dispatch.run_experts`` runs each expert once per source: N E/N small products, each as tall
as one source's rows for one expert (T k / E on average: fine-grained experts make them
small). Megatron-Core (``sort_chunks_by_idxs``, then a grouped GEMM) and torchtitan
(``generate_permute_indices``, then ``torch._grouped_mm``) regroup the rows expert-major and run
every expert in one grouped product. torchtitan pads each expert's rows to a multiple of 8 (16
or 32 for FP8 kernels), the alignment the grouped kernel wants, into a buffer of a size known
without reading the counts (rows + E/N x 8, rounded up), so the regrouping needs no copy of the
counts to the host; here the buffer has rows + (E/N)(align - 1) rows, the exact bound.

``expert_major`` computes where each received row goes (on the device, from the counts);
``run_grouped`` runs the experts on the regrouped rows through ``helpers.compat.grouped_mm``
(``torch._grouped_mm`` where this torch and device have it, one product per expert otherwise)
and returns the outputs in the received order, equal to ``run_experts``'.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from helpers.compat import grouped_mm
from helpers.parallel.expert.moe import Experts

__all__ = ["expert_major", "run_grouped"]


def expert_major(counts: torch.Tensor, rows: int, align: int = 1):
    """(dest [rows], offsets [E/N] int32, size): where each received row goes in the
    expert-major buffer, the end of each expert's group there, and the buffer's rows.

    counts [N, E/N]: rows from each source for each local expert (on the rows' device); rows:
    how many arrived (a host number: the received tensor's length). Each expert's group is
    padded to a multiple of ``align``; the buffer has rows + E/N (align - 1) rows either way."""
    n, local = counts.shape
    per_expert = counts.sum(0)
    padded = (per_expert + align - 1) // align * align
    ends = torch.cumsum(padded, 0)
    before = torch.cumsum(counts, 0) - counts  # rows of earlier sources, per expert
    chunk_dest = ((ends - padded).unsqueeze(0) + before).reshape(-1)  # (source, expert) order
    flat = counts.reshape(-1)
    chunk_src = torch.cumsum(flat, 0) - flat
    chunk = torch.repeat_interleave(torch.arange(n * local, device=counts.device), flat,
                                    output_size=rows)  # fmt: skip
    dest = chunk_dest[chunk] + torch.arange(rows, device=counts.device) - chunk_src[chunk]
    return dest, ends.to(torch.int32), rows + local * (align - 1)


def run_grouped(received: torch.Tensor, recv_counts, experts: Experts, align: int = 1):
    """This rank's experts on the rows it received (``dispatch``'s layout), regrouped by expert
    and run as one grouped product per matrix; the outputs come back in the received order."""
    counts = torch.as_tensor(recv_counts, dtype=torch.long, device=received.device)
    dest, offsets, size = expert_major(counts, len(received), align)
    buffer = received.new_zeros(size, received.shape[1]).index_copy(0, dest, received)
    hidden = F.gelu(grouped_mm(buffer, experts.w1.to(received.dtype), offsets))
    out = grouped_mm(hidden, experts.w2.to(received.dtype), offsets)
    return out[dest]
