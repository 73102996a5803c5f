"""Each step's loss, and the time the steps took, without making the host wait every step.

``loss.item()`` copies one number from the GPU, so the host waits there until the device
has finished everything queued before it: one synchronisation per step, and the CPU can
no longer run ahead and queue the next step's kernels while the GPU works on this one.
A training loop instead keeps each step's loss on the device and copies them to the host
``every`` steps, in one transfer:

    log = StepLog(every=10)
    for step ...:
        ...
        log.record(loss)                 # no wait
        if log.due():
            log.flush()                  # one wait per `every` steps
    log.flush()

The clock is read at the same moments, when the device has just finished what was queued,
so the time per step it gives is the device's, not the time the host took to queue work.
The first step of a process (one-off costs: DDP's set-up, the allocator, kernel choices)
is not timed: the clock starts at the flush that follows it.
"""

from __future__ import annotations

import time

import torch

__all__ = ["StepLog"]


class StepLog:
    """Losses per step (``losses``, floats) and the seconds of the timed steps."""

    def __init__(self, every: int, losses: list[float] | None = None):
        if every < 1:
            raise ValueError(f"every={every}: flush the losses every 1 or more steps")
        self.every = every
        self.losses: list[float] = list(losses or [])  # on the host, one per step
        self.elapsed = 0.0  # seconds of the timed steps
        self.timed_steps = 0
        self.flushes = 0  # host synchronisations so far (a test counts them)
        self._pending: list[torch.Tensor] = []  # losses still on the device
        self._since = 0  # steps since the clock was last read
        self._clock: float | None = None  # None until the first flush

    @property
    def steps(self) -> int:
        """Steps recorded, on the host or still on the device."""
        return len(self.losses) + len(self._pending)

    def record(self, loss: torch.Tensor) -> None:
        """Keep this step's loss where it is (no copy, no wait)."""
        self._pending.append(loss.detach())
        self._since += 1

    def due(self) -> bool:
        """True on the steps where the loop should flush: the first, then every `every`."""
        return self.steps == 1 or self.steps % self.every == 0

    def flush(self) -> None:
        """Copy the pending losses to the host in one transfer (the host waits here)."""
        if self._pending:
            self.losses.extend(torch.stack(self._pending).float().cpu().tolist())
            self._pending.clear()
        self.flushes += 1
        now = time.perf_counter()
        if self._clock is not None:
            self.elapsed += now - self._clock
            self.timed_steps += self._since
        self.restart_clock(now)

    def restart_clock(self, now: float | None = None) -> None:
        """Start timing from here: after a flush, or after work that is not a step (a save)."""
        self._clock, self._since = (time.perf_counter() if now is None else now), 0
