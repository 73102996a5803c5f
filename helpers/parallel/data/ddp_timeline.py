"""What is in flight during backward: one training step timed, for every way of averaging.

``measure(d, make_model, x, y, route)`` runs a few warm-up steps and then
``repeats`` timed steps of one route and returns, per step phase, the median time
since the step began, and every all-reduce's launch and completion:

    route             how gradients are averaged
    "no communication" not at all (the compute alone: the floor)
    "after backward"  average_gradients: one all-reduce per parameter, one after another
    "per parameter"   OverlapDDP: each parameter's all-reduce starts from its hook
    "buckets by hand" BucketedDDP: a bucket's all-reduce starts with its last gradient
    "torch DDP"       DistributedDataParallel, its buckets recorded by a comm hook

Every rank runs the same steps; rank 0's view is what a notebook draws. Times
are wall-clock on this rank, with ``dist.synchronize`` before each reading so
that on a GPU they include the device's queued work.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as tdist
from torch import nn

from helpers.dist import Dist, synchronize
from helpers.parallel.data.bucketed_ddp import BucketedDDP
from helpers.parallel.data.buckets import BucketRecorder
from helpers.parallel.data.ddp import broadcast_state, wrap
from helpers.parallel.data.overlap_ddp import CommEvent, OverlapDDP

__all__ = ["ROUTES", "measure"]

ROUTES = ("no communication", "after backward", "per parameter", "buckets by hand", "torch DDP")


class _AfterBackward(nn.Module):
    """average_gradients after backward, with each all-reduce's start and end written down."""

    def __init__(self, module: nn.Module, world_size: int, communicate: bool):
        super().__init__()
        self.module, self.world_size, self.communicate = module, world_size, communicate
        broadcast_state(module)
        self.log: list[CommEvent] = []

    def forward(self, *args):
        return self.module(*args)

    def start_step(self) -> None:
        self.log = []

    def finish_gradient_synchronization(self) -> None:
        for name, p in self.module.named_parameters():
            if self.communicate and p.grad is not None:
                event = CommEvent(name, p.grad.numel(), time.perf_counter())
                tdist.all_reduce(p.grad)
                p.grad /= self.world_size
                event.done = time.perf_counter()
                self.log.append(event)


def _build(d: Dist, model: nn.Module, route: str, bucket_cap_mb: float | None):
    """(module to train, sync after backward, function returning this step's events)."""
    model = model.to(d.device)
    if route in ("no communication", "after backward"):
        net = _AfterBackward(model, d.world_size, communicate=route == "after backward")
        return net, net.finish_gradient_synchronization, lambda: net.log
    if route == "per parameter":
        net = OverlapDDP(model)
        return net, net.finish_gradient_synchronization, lambda: net.log
    if route == "buckets by hand":
        net = BucketedDDP(model, bucket_cap_mb=bucket_cap_mb or 25.0)
        return net, net.finish_gradient_synchronization, lambda: net.log
    if route == "torch DDP":
        net = wrap(model, d, bucket_cap_mb=bucket_cap_mb)
        rec = BucketRecorder(d.world_size, {p.data_ptr(): n for n, p in model.named_parameters()})
        net.register_comm_hook(rec, BucketRecorder.hook)

        def events():  # BucketRecorder times are relative to its t0: make them absolute
            return [CommEvent(f"bucket {e.index}", e.numel, rec.t0 + e.launched,
                              rec.t0 + e.done) for e in rec.events]  # fmt: skip

        net.recorder = rec
        return net, lambda: None, events
    raise ValueError(f"unknown route {route!r}: use one of {ROUTES}")


def _one_step(d: Dist, net, sync, opt, x, y) -> dict:
    if hasattr(net, "start_step"):
        net.start_step()
    if hasattr(net, "recorder"):
        net.recorder.start()
    opt.zero_grad(set_to_none=True)
    tdist.barrier()  # every rank starts the step together
    synchronize(d.device)
    t0 = time.perf_counter()
    loss = nn.functional.cross_entropy(net(x), y)
    synchronize(d.device)
    t_fwd = time.perf_counter()
    loss.backward()
    synchronize(d.device)
    t_bwd = time.perf_counter()
    sync()
    synchronize(d.device)
    t_sync = time.perf_counter()
    opt.step()
    synchronize(d.device)
    return {"t0": t0, "forward": t_fwd - t0, "backward": t_bwd - t0, "synced": t_sync - t0,
            "step": time.perf_counter() - t0}  # fmt: skip


def measure(
    d: Dist,
    make_model,
    x: torch.Tensor,
    y: torch.Tensor,
    routes=ROUTES,
    bucket_cap_mb: float | None = None,
    repeats: int = 5,
    warmup: int = 2,
) -> dict:
    """Time ``repeats`` rounds of one step per route on this rank's (x, y).

    A round runs every route once, one after another, so that a slow moment of a
    shared machine hits all routes alike: compare routes within a round. Returns
    {route: {"forward", "backward", "synced", "step": median seconds since the step
    began at which forward ended, backward returned, the gradients were averaged and
    the optimizer step ended; "rounds": those four per round (the spread);
    "events": [{"label", "numel", "launched", "done"}], per-event medians in launch
    order}}.
    """
    x, y = x.to(d.device), y.to(d.device)
    built = {}
    for route in routes:
        torch.manual_seed(0)
        net, sync, events = _build(d, make_model(), route, bucket_cap_mb)
        built[route] = (net, sync, events, torch.optim.SGD(net.parameters(), lr=0.01))
    rounds = {route: [] for route in routes}
    logs = {route: [] for route in routes}
    for r in range(warmup + repeats):  # DDP rebuilds its buckets after its first step
        for route, (net, sync, events, opt) in built.items():
            s = _one_step(d, net, sync, opt, x, y)
            if r >= warmup:
                rounds[route].append(s)
                logs[route].append(_relative(events(), s["t0"]))
    return {route: _summary(route, rounds[route], logs[route]) for route in routes}


def _relative(events: list[CommEvent], t0: float) -> list[tuple]:
    deadline = time.perf_counter() + 1.0  # a completion callback may lag its wait() by a hair
    while any(e.done != e.done for e in events) and time.perf_counter() < deadline:
        time.sleep(1e-4)
    return [(e.label, e.numel, e.launched - t0, e.done - t0) for e in events]


def _summary(route: str, steps: list[dict], logs: list[list]) -> dict:
    """Medians of the phases, and the events of the median step (one real, consistent step)."""
    keys = ("forward", "backward", "synced", "step")
    med = {k: statistics.median(s[k] for s in steps) for k in keys}
    typical = sorted(range(len(steps)), key=lambda i: steps[i]["step"])[len(steps) // 2]
    events = [dict(zip(("label", "numel", "launched", "done"), e, strict=True))
              for e in logs[typical]]  # fmt: skip
    return {"route": route, **med, "rounds": [{k: s[k] for k in keys} for s in steps],
            "typical": {k: steps[typical][k] for k in keys}, "events": events}  # fmt: skip
