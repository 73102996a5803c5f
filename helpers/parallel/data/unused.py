"""Parameters that get no gradient: DDP's commonest hang, shown safely on gloo ranks.

DDP's reducer counts, bucket by bucket, the gradients that backward has produced, and
all-reduces a bucket when its count is complete. A parameter the forward pass did not use
gets no gradient, so its bucket never completes:

* if **every** rank skipped it, no rank launches that bucket; the next forward notices that
  the last reduction never finished and raises ("Expected to have finished reduction in the
  prior iteration ...");
* if **some** ranks used it (a data-dependent branch, a mixture of experts), those ranks
  launch the bucket and wait in its all-reduce for peers that never join: a **hang**, until
  the process group's timeout (NCCL's default is 10 minutes; here a 2 s gloo group).

``DDP(model, find_unused_parameters=True)`` walks the autograd graph from the outputs after
each forward and marks what it did not reach as ready (its gradient counts as zero), so
every rank completes every bucket. The walk costs time every step, which is why it is off
by default.

``case`` runs one step pattern on every rank inside its own process group with a short
timeout, catches what happens, and returns it, so a notebook shows the hang without one.
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as tdist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.dist import Dist

__all__ = ["TwoHeads", "case"]


class TwoHeads(nn.Module):
    """A body and two heads; ``forward(x, heads)`` uses the heads named ("a", "b", "ab")."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.body = nn.Linear(width, width)
        self.a = nn.Linear(width, 2)
        self.b = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor, heads: str) -> torch.Tensor:
        h = torch.tanh(self.body(x))
        return sum(getattr(self, k)(h) for k in heads)


def case(
    d: Dist, heads_of: list[str], find_unused: bool, timeout_s: float = 2.0, steps: int = 2
) -> dict:
    """``steps`` DDP steps where rank r uses ``heads_of[r]``; what happened on this rank.

    Returns {"outcome": "ok" or the exception's type, "seconds": until it ended,
    "message": the exception's first line, "step": the step it reached,
    "grad_b": this rank's averaged gradient norm of head b (ok runs)}. The collectives
    run in a new gloo group whose timeout is ``timeout_s``: a rank waiting for a peer
    that never comes fails after that long instead of hanging.
    """
    tdist.barrier()  # line the ranks up on the default group, whose timeout is long
    group = tdist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    torch.manual_seed(0)
    net = DDP(TwoHeads(), process_group=group, find_unused_parameters=find_unused)
    gen = torch.Generator().manual_seed(d.rank)
    start, reached = time.perf_counter(), 0
    try:
        for step in range(steps):
            reached = step  # the step a failure happens in
            net.zero_grad()
            net(torch.randn(4, 8, generator=gen), heads_of[d.rank]).sum().backward()
        grad_b = net.module.b.weight.grad
        out = {"outcome": "ok", "message": "", "step": steps,
               "grad_b": 0.0 if grad_b is None else float(grad_b.norm())}  # fmt: skip
    except RuntimeError as e:  # the reducer's error, or the collective's timeout
        out = {"outcome": type(e).__name__, "message": str(e).strip().splitlines()[0],
               "step": reached, "grad_b": None}  # fmt: skip
    out["seconds"] = time.perf_counter() - start
    tdist.barrier()  # default group: a rank that failed fast waits here for one still waiting
    return out
