"""How many intra-op threads a small model trains fastest with on a CPU: measured, not assumed.

torch runs each CPU operator on ``torch.get_num_threads()`` OpenMP threads (one per core by
default), which meet at a barrier at the end of every operator. A small network's operators
last tens of microseconds, so a step is thousands of barriers. While other programs keep the
cores busy, the operating system takes a core from one of the threads for a time slice
(milliseconds), and the other threads wait for it at the next barrier: notebook 01's CNN then
trains many times slower on 2 threads than on 1 (measured on a 2-core machine with two busy
programs beside it: 502 against 4,507 samples/s; with the cores idle 9,678 against 6,985).

    best, rates = pick_threads(model, (x, y), device)   # {threads: samples/s}
    torch.set_num_threads(best)

On a GPU the host's threads only launch kernels: nothing is measured and the count is kept.
"""

from __future__ import annotations

import copy
import os
import statistics
import time

import torch
import torch.nn as nn

from helpers import devices
from helpers.training.loop import train_step

__all__ = ["candidates", "pick_threads"]


def candidates(cores: int | None = None) -> list[int]:
    """Thread counts worth trying on ``cores`` cores (default: the cores this process may use)."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = max(1, cores or 1)
    return sorted({1, max(1, cores // 2), cores})


def _rate(model, batch, device, steps: int) -> float:
    optimizer, loss_fn = torch.optim.SGD(model.parameters(), lr=0.0), nn.CrossEntropyLoss()
    x, y = batch
    start = time.perf_counter()
    for _ in range(steps):
        train_step(model, x, y, optimizer, loss_fn, None, None, device)
    return steps * len(y) / (time.perf_counter() - start)


def pick_threads(model: nn.Module, batch, device: torch.device, counts: list[int] | None = None,
                 steps: int = 5, rounds: int = 3) -> tuple[int, dict[int, float]]:  # fmt: skip
    """(fastest thread count, {count: median samples/s}) for training steps of ``model`` on
    ``batch`` (x, y already on ``device``), on a copy of the model.

    The counts take turns, ``rounds`` times, so a burst of load slows every count alike; the
    median of the rounds is what a run should expect from the machine as it is now. A count
    at under half the best rate after a round is not timed again. The
    caller's thread count is restored: set the one returned with ``torch.set_num_threads``.
    On a GPU nothing is measured: ``(torch.get_num_threads(), {})``.
    """
    before = torch.get_num_threads()
    if devices.is_gpu(device):
        return before, {}
    model = copy.deepcopy(model).to(device).train()
    counts = counts or candidates()
    seen: dict[int, list[float]] = {n: [] for n in counts}
    try:
        for n in counts:  # warm-up: each count's first steps create its kernels' state
            torch.set_num_threads(n)
            _rate(model, batch, device, 2)
        for _ in range(rounds):
            for n in counts:
                torch.set_num_threads(n)
                seen[n].append(_rate(model, batch, device, steps))
            # A count at under half the best rate has lost already: on a busy machine its steps
            # are the slow ones, and timing it again would cost seconds.
            best = max(statistics.median(r) for r in seen.values())
            counts = [n for n in counts if statistics.median(seen[n]) > best / 2]
    finally:
        torch.set_num_threads(before)
    rates = {n: statistics.median(r) for n, r in seen.items()}
    return max(rates, key=rates.get), rates
