"""DDP's gradient buckets and the overlap of their all-reduce with backward, made visible.

DDP packs parameters' gradients into flat buckets of about ``bucket_cap_mb``
MiB, in reverse order of the forward pass (the last layer's gradients are ready
first in backward). When every gradient of a bucket is ready, DDP calls its
communication hook, which starts an asynchronous all_reduce while backward goes
on computing earlier layers:

    backward:  [fc3 fc2 fc1 | conv2 conv1]          time ->
    bucket 0:        launch ==== all_reduce ====> done
    bucket 1:                          launch == all_reduce ==> done  (exposed)

``BucketRecorder`` is such a hook: it averages exactly like DDP's default and
records when each bucket was launched and finished. ``timeline`` runs a few
backward passes of a model with it and reports median times.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as tdist
from torch import nn

from helpers.dist import Dist, synchronize
from helpers.parallel.data.ddp import wrap

__all__ = ["BucketEvent", "BucketRecorder", "timeline"]


@dataclass
class BucketEvent:
    """One bucket's all_reduce in one backward pass (times in s, from ``t0``)."""

    index: int
    numel: int
    params: list[str]  # names of the parameters whose gradients share this bucket
    launched: float
    done: float = float("nan")


@dataclass
class BucketRecorder:
    """A DDP communication hook that averages like the default and records each bucket.

        rec = BucketRecorder(world_size, names={p.data_ptr(): name, ...})
        ddp.register_comm_hook(rec, BucketRecorder.hook)  # before the first backward
        rec.start()            # set t0 (e.g. just before loss.backward())
        loss.backward()
        rec.events             # [BucketEvent(index, numel, params, launched, done), ...]

    ``launched`` is when DDP handed the bucket over (its gradients were all ready);
    ``done`` is when its all_reduce completed. A bucket launched before backward
    ends is communication overlapping computation.
    """

    world_size: int
    names: dict[int, str] = field(default_factory=dict)  # data_ptr -> parameter name
    t0: float = 0.0
    events: list[BucketEvent] = field(default_factory=list)

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.events = []

    @staticmethod
    def hook(state, bucket):  # no annotations: DDP checks them literally
        """Called by DDP when a bucket's gradients are all ready; returns a Future."""
        ev = BucketEvent(
            index=bucket.index(),
            numel=bucket.buffer().numel(),
            params=[state.names.get(p.data_ptr(), "?") for p in bucket.parameters()],
            launched=time.perf_counter() - state.t0,
        )
        state.events.append(ev)
        # The bucket is one flat buffer holding several parameters' gradients.
        buf = bucket.buffer().div_(state.world_size)
        fut = tdist.all_reduce(buf, async_op=True).get_future()

        def finished(f: torch.futures.Future) -> torch.Tensor:
            ev.done = time.perf_counter() - state.t0
            return f.value()[0]

        return fut.then(finished)


def timeline(
    d: Dist,
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    bucket_cap_mb: float | None = None,
    repeats: int = 5,
) -> dict:
    """Time each DDP bucket's all_reduce inside backward on (x, y); medians of ``repeats``.

    A first, untimed iteration lets DDP rebuild its buckets in the order the
    gradients actually became ready (the initial order is reverse parameter
    order). Returns {"buckets": [{"index", "numel", "params", "launched", "done"}],
    "backward": median seconds of backward with DDP (it ends after the last
    bucket's all_reduce), "backward_no_comm": median seconds of the same backward
    under no_sync() (no communication at all), "pairs": [(with DDP, no_sync)] of
    each repeat, run back to back}. Times are from the start of backward.
    On GPUs "launched" is when the CPU handed the bucket to NCCL, which runs it as
    a kernel on its own stream, beside the compute kernels (it occupies some SMs).
    """
    net = wrap(model, d, bucket_cap_mb=bucket_cap_mb)
    names = {p.data_ptr(): n for n, p in net.module.named_parameters()}
    rec = BucketRecorder(d.world_size, names)
    net.register_comm_hook(rec, BucketRecorder.hook)
    x, y = x.to(d.device), y.to(d.device)

    def backward_once() -> float:
        net.zero_grad()
        loss = nn.functional.cross_entropy(net(x), y)
        tdist.barrier()  # start the backward passes together
        rec.start()
        loss.backward()
        synchronize(d.device)  # GPU work is asynchronous: wait for it before reading the clock
        return time.perf_counter() - rec.t0

    backward_once()  # bucket rebuild
    runs, times, local = [], [], []
    for _ in range(repeats):
        times.append(backward_once())
        runs.append(list(rec.events))
        with net.no_sync():  # gradients stay local: the pure compute time of backward
            local.append(backward_once())
    buckets = []
    for i, ev in enumerate(runs[0]):
        buckets.append({
            "index": ev.index, "numel": ev.numel, "params": ev.params,
            "launched": statistics.median(r[i].launched for r in runs),
            "done": statistics.median(r[i].done for r in runs),
        })  # fmt: skip
    return {
        "buckets": buckets,
        "backward": statistics.median(times),
        "backward_no_comm": statistics.median(local),
        "pairs": list(zip(times, local, strict=True)),
    }
