"""Data parallelism by hand with buckets: fewer, larger all-reduces, still overlapped.

One all-reduce per parameter (helpers.parallel.data.overlap_ddp) pays the per-message
latency alpha once per tensor: a model with hundreds of small tensors (biases,
norms) sends hundreds of tiny messages. DDP packs gradients into *buckets*:

1. **Assign** the parameters to buckets in *reverse* order (backward produces the
   last layer's gradients first), filling each bucket up to ``bucket_cap_mb`` MiB.
   A parameter is never split, so one larger than the cap gets a bucket of its own.
2. **Count** ready gradients per bucket in the post-accumulate-grad hook; when the
   *last* gradient of a bucket is ready, **flatten** the bucket's gradients into one
   contiguous tensor and start its asynchronous all-reduce.
3. **Wait** for every bucket before the optimizer step and **unflatten**: copy each
   slice of the averaged flat tensor back into its parameter's ``.grad``.

    reverse order: fc3.bias fc3.weight fc2.bias fc2.weight | fc1.bias | fc1.weight | conv2...
    bucket:        [------------ 0 -------------------------] [- 1 -]  [--- 2 ---]  [- 3 ...

Torch's DDP differs in two details: it closes a bucket once it *reaches* the cap
(so a bucket may overshoot by its last parameter), and after the first iteration it
rebuilds the buckets in the order gradients actually arrived.
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as tdist
from torch import nn

from helpers.parallel.data.ddp import broadcast_state
from helpers.parallel.data.overlap_ddp import CommEvent

__all__ = ["assign_buckets", "flatten", "unflatten", "BucketedDDP"]


def assign_buckets(params: list[torch.Tensor], cap_bytes: int) -> list[list[int]]:
    """Indices of ``params`` per bucket, walking them in reverse order.

    A bucket takes parameters until the next one would bring it over ``cap_bytes``
    (or has another dtype: a flat tensor has one dtype); then a new bucket starts.
    """
    if cap_bytes <= 0:
        raise ValueError(f"bucket cap must be positive, got {cap_bytes} bytes")
    buckets: list[list[int]] = []
    size = 0
    for i in reversed(range(len(params))):
        p = params[i]
        nbytes = p.numel() * p.element_size()
        same_dtype = buckets and params[buckets[-1][0]].dtype == p.dtype
        if buckets and same_dtype and size + nbytes <= cap_bytes:
            buckets[-1].append(i)
            size += nbytes
        else:
            buckets.append([i])
            size = nbytes
    return buckets


def flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One contiguous 1-D copy of ``tensors``, one after another."""
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """Views of ``flat`` shaped like each tensor of ``like`` (the inverse of flatten)."""
    sizes = [t.numel() for t in like]
    return [chunk.view_as(t) for chunk, t in zip(flat.split(sizes), like, strict=True)]


class BucketedDDP(nn.Module):
    """DDP by hand with size-capped buckets, each all-reduced when its last gradient is ready."""

    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25.0, group=None):
        super().__init__()
        self.module = module
        self.group = group
        self.world_size = tdist.get_world_size(group)
        broadcast_state(module, group=group)
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.buckets = assign_buckets(self.params, int(bucket_cap_mb * 2**20))
        self._bucket_of = {}  # parameter -> index of its bucket
        for b, members in enumerate(self.buckets):
            for i in members:
                self._bucket_of[self.params[i]] = b
        self._ready = [0] * len(self.buckets)  # gradients ready per bucket this backward
        self._pending: list = []  # (work, bucket index, flat tensor) in flight
        self.require_sync = True
        self.log: list[CommEvent] = []
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p: torch.Tensor) -> None:
        if not self.require_sync:
            return
        b = self._bucket_of[p]
        self._ready[b] += 1
        if self._ready[b] == len(self.buckets[b]):  # the bucket's last gradient
            self._launch(b)

    def _launch(self, b: int) -> None:
        flat = flatten([self.params[i].grad for i in self.buckets[b]])
        flat.div_(self.world_size)
        event = CommEvent(f"bucket {b}", flat.numel(), time.perf_counter())
        work = tdist.all_reduce(flat, group=self.group, async_op=True)
        event.watch(work)
        self._pending.append((work, b, flat))
        self.log.append(event)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        """Wait for every bucket, then copy the averages back into each ``.grad``."""
        missing = [b for b, n in enumerate(self._ready) if n != len(self.buckets[b])]
        if self.require_sync and missing:
            names = [self.names[i] for b in missing for i in self.buckets[b]
                     if self.params[i].grad is None]  # fmt: skip
            raise RuntimeError(
                f"bucket(s) {missing} were never all-reduced: {names or 'some parameters'} "
                "got no gradient in this backward. Use every trainable parameter in forward "
                "on every rank, or freeze it (requires_grad_(False)) before wrapping."
            )
        for work, b, flat in self._pending:
            work.wait()
            members = [self.params[i] for i in self.buckets[b]]
            for p, avg in zip(members, unflatten(flat, members), strict=True):
                p.grad.copy_(avg)
        self._pending.clear()
        self._ready = [0] * len(self.buckets)

    def start_step(self) -> None:
        """Forget the previous step's log (call before forward when you draw timelines)."""
        self.log = []

    def bucket_names(self) -> list[list[str]]:
        """The parameter names of each bucket, in launch order."""
        return [[self.names[i] for i in members] for members in self.buckets]

    @contextlib.contextmanager
    def no_sync(self):
        """Gradient accumulation: inside, backward adds to .grad and sends nothing."""
        self.require_sync = False
        try:
            yield
        finally:
            self.require_sync = True
