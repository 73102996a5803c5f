"""Why DDP launches buckets in index order, and why it rebuilds them after the first step.

Collectives are matched by their order, not by a name: the k-th all-reduce a rank starts
meets the k-th all-reduce of every other rank. If rank 0 launched bucket 1 before bucket 0
and rank 1 the other way round, rank 0's bucket 1 would be summed with rank 1's bucket 0
(or, at different sizes, both would wait for ever). So DDP's reducer launches buckets
strictly in index order: a bucket whose gradients are ready waits until every bucket
before it has been launched.

At construction DDP does not know the order in which backward will produce gradients. By
default (``find_unused_parameters=False``) it does not guess: the first step uses one bucket
for everything, all-reduced once backward has finished, while DDP records the order in which
the gradients really became ready. Before the second forward it rebuilds the buckets in that
order, with rank 0's order broadcast so that every rank builds the same buckets, and it does
this once. With ``find_unused_parameters=True`` it buckets by the reverse of
``model.parameters()`` from the start and never rebuilds: when that guess is wrong (a layer
registered in another order than it is used), bucket 0 holds a gradient that is ready last,
and no bucket leaves before backward ends, at any step.

``launches`` records, step by step, which parameters each bucket held and when it was
launched; ``Misordered`` is a model whose registration order is the reverse of its use.

The cost of a bucket size, the trade-off Li et al. (VLDB 2020) describe for DDP's buckets:
``exposed_time`` models the communication left after backward. Buckets of b bytes out of G
send G/b messages, each costing alpha plus its bytes times beta; all but the last can travel
during the backward window T; the last one always waits. Small buckets pay alpha many
times, large ones leave a long last bucket: the best size lies between.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as tdist
from torch import nn

from helpers.dist import Dist, synchronize
from helpers.parallel.data.buckets import BucketRecorder
from helpers.parallel.data.ddp import wrap

__all__ = ["Misordered", "launches", "split_all_reduce", "fit_split", "exposed_time"]


class Misordered(nn.Module):
    """``depth`` square layers, registered last-first: used l0, l1, ..., registered ..., l1, l0."""

    def __init__(self, width: int = 256, depth: int = 4):
        super().__init__()
        self.depth = depth
        for i in reversed(range(depth)):  # registration order: l3, l2, l1, l0
            self.add_module(f"l{i}", nn.Linear(width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.depth):  # use order: l0, l1, l2, l3
            x = torch.relu(getattr(self, f"l{i}")(x))
        return x


def launches(d: Dist, model: nn.Module, x: torch.Tensor, steps: int = 3, cap_mb: float = 0.3,
             find_unused: bool = False) -> list:  # fmt: skip
    """Per step: {"buckets": [{"index", "params", "launched" (s after backward began)}],
    "backward": seconds}. Step 0 runs on the buckets DDP made at construction."""
    net = wrap(model, d, bucket_cap_mb=cap_mb, find_unused_parameters=find_unused)
    names = {p.data_ptr(): n for n, p in net.module.named_parameters()}
    rec = BucketRecorder(d.world_size, names)
    net.register_comm_hook(rec, BucketRecorder.hook)
    out = []
    for _ in range(steps):
        net.zero_grad()
        loss = net(x).square().mean()
        tdist.barrier()
        rec.start()
        loss.backward()
        backward = time.perf_counter() - rec.t0
        events = [
            {"index": e.index, "params": e.params, "launched": e.launched} for e in rec.events
        ]
        out.append({"buckets": events, "backward": backward})
    return out


def exposed_time(grad_bytes: float, bucket_bytes: float, alpha: float, beta: float,
                 backward_s: float) -> float:  # fmt: skip
    """Seconds of communication left after backward, for buckets of ``bucket_bytes``.

    The last bucket is launched when backward ends, so its alpha + b beta is always
    exposed; the other buckets' time is exposed only where it overruns the backward window.
    beta: seconds per byte of the all-reduce (2 (N - 1) / N times the bytes, over the link).
    """
    b = min(bucket_bytes, grad_bytes)
    n = max(1, round(grad_bytes / b))
    last = alpha + b * beta
    others = (n - 1) * alpha + (grad_bytes - b) * beta
    return last + max(0.0, others - backward_s)


def split_all_reduce(d: Dist, grad_bytes: int, bucket_bytes: int, repeats: int = 5) -> float:
    """Median seconds to all-reduce ``grad_bytes`` as buckets of ``bucket_bytes``, all launched
    asynchronously and then waited for, as DDP's reducer launches them (no backward here)."""
    n = max(1, grad_bytes // bucket_bytes)
    bufs = [torch.ones(bucket_bytes // 4, device=d.device) for _ in range(n)]
    times = []
    for _ in range(repeats + 1):  # the first round is a warm-up
        tdist.barrier()
        start = time.perf_counter()
        for work in [tdist.all_reduce(b, async_op=True) for b in bufs]:
            work.wait()
        synchronize(d.device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def fit_split(grad_bytes: int, rows: list[tuple[int, float]]) -> tuple[float, float]:
    """(alpha, beta) from [(buckets, seconds)] at a fixed total: seconds = n alpha + G beta.

    Each point counts by its **relative** error (least squares on t_model / t_measured = 1),
    so the n = 1 point, a few milliseconds, weighs as much as the n = 256 one, a hundred. An
    ordinary line lets the large-n points fix the slope and leaves the intercept G beta to
    their noise: in a full run of notebook 03 it put the 1-bucket time at 3.5x the measured
    one (and nothing stopped it going negative). Check the fit against the n = 1 point.
    """
    if len(rows) < 2 or any(t <= 0 for _, t in rows):
        raise ValueError(f"fit_split needs two or more (buckets, seconds > 0) points, got {rows!r}")
    # Normal equations of sum_i ((n_i alpha + c) / t_i - 1)^2, with c = G beta.
    a = [(n / t, 1 / t) for n, t in rows]
    s11, s12, s22 = (sum(x * y for x, y in pairs) for pairs in
                     ([(u, u) for u, _ in a], [(u, v) for u, v in a], [(v, v) for _, v in a]))  # fmt: skip
    b1, b2 = sum(u for u, _ in a), sum(v for _, v in a)
    det = s11 * s22 - s12 * s12
    if det <= 0:
        raise ValueError(f"fit_split needs at least two different bucket counts, got {rows!r}")
    alpha, c = (b1 * s22 - b2 * s12) / det, (s11 * b2 - s12 * b1) / det
    return alpha, c / grad_bytes
