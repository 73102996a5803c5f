"""Data parallelism by hand that overlaps: one asynchronous all-reduce per parameter.

``average_gradients`` (helpers.parallel.data.ddp) waits for the whole backward pass and
then sends one gradient after another. But backward produces the gradients one at
a time, last layer first, and each can travel as soon as it exists. A
*post-accumulate-grad hook* is called by autograd right after a parameter's
``.grad`` is complete for this backward; from there we start an asynchronous
all-reduce and return at once, so backward goes on computing earlier layers while
the gradient is in flight::

    net = OverlapDDP(model)         # rank 0's parameters and buffers copied to all
    loss = F.cross_entropy(net(x), y)
    loss.backward()                 # hooks: all_reduce(p.grad, async_op=True) per p
    net.finish_gradient_synchronization()   # wait for every one of them
    opt.step()                      # the same averaged gradient on every rank

    backward:  [fc3][fc2][ fc1 ][conv2][conv1]          time ->
    in flight:     fc3=>  fc2===>   fc1=========>  conv2==> conv1=>|wait|step

Tied parameters (one ``nn.Parameter`` used twice) appear once in
``named_parameters()``; autograd sums both uses before the hook fires, so their
gradient travels once. Frozen parameters (``requires_grad=False``) get no hook and
no gradient. Every rank must produce gradients for the same parameters in the same
order, since collectives are matched by their order (what DDP also assumes unless
it is told ``find_unused_parameters=True``).

Each launch and completion is written to ``net.log`` (``CommEvent``), so a notebook
can draw what was in flight during backward (helpers.parallel.data.ddp_timeline).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch
import torch.distributed as tdist
from torch import nn

from helpers.parallel.data.ddp import broadcast_state

__all__ = ["CommEvent", "OverlapDDP"]


@dataclass
class CommEvent:
    """One all-reduce of one backward: what was sent, when it left and when it was done.

    Times are ``time.perf_counter()`` seconds. ``done`` is set by a callback when
    the collective's future completes: with gloo, when the all-reduce has finished.
    With NCCL the future completes as soon as the work is queued on NCCL's stream, so
    on GPUs ``done`` says nothing about the transfer: time it with the profiler.
    """

    label: str  # the parameter name, or "bucket k"
    numel: int
    launched: float
    done: float = float("nan")

    def watch(self, work) -> None:
        """Record ``done`` when the asynchronous collective ``work`` completes."""

        def finished(fut):
            self.done = time.perf_counter()
            return fut.value()

        work.get_future().then(finished)


class OverlapDDP(nn.Module):
    """DDP by hand: per-parameter asynchronous all-reduces started from gradient hooks."""

    def __init__(self, module: nn.Module, group=None):
        super().__init__()
        self.module = module
        self.group = group
        self.world_size = tdist.get_world_size(group)
        broadcast_state(module, group=group)  # replicas start from rank 0's state
        self.require_sync = True
        self._pending: list = []  # (work, param) of the all-reduces in flight
        self.log: list[CommEvent] = []  # this step's all-reduces, in launch order
        for name, p in module.named_parameters():  # each Parameter once (tied: first name)
            if p.requires_grad:  # frozen: no gradient, nothing to send
                p.register_post_accumulate_grad_hook(self._make_hook(name))

    def _make_hook(self, name: str):
        def hook(p: torch.Tensor) -> None:  # p.grad is complete for this backward
            if not self.require_sync:
                return
            p.grad.div_(self.world_size)  # divide first: the sum is then the mean
            event = CommEvent(name, p.grad.numel(), time.perf_counter())
            work = tdist.all_reduce(p.grad, group=self.group, async_op=True)
            event.watch(work)
            self._pending.append((work, p))
            self.log.append(event)

        return hook

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        """Wait until every all-reduce started in backward is done (call before step)."""
        for work, _p in self._pending:
            work.wait()  # on a GPU: the current stream waits for NCCL's
        self._pending.clear()

    def start_step(self) -> None:
        """Forget the previous step's log (call before forward when you draw timelines)."""
        self.log = []

    @contextlib.contextmanager
    def no_sync(self):
        """Gradient accumulation: inside, backward adds to .grad and sends nothing."""
        self.require_sync = False
        try:
            yield
        finally:
            self.require_sync = True
