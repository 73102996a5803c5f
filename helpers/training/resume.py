"""Stop cleanly when the cluster asks: a signal sets a flag, the loop checkpoints at a step.

Slurm warns a job before it ends it:

    #SBATCH --signal=B:USR1@90   SIGUSR1 90 s before the time limit (to the batch shell,
                                 which passes it on as SIGTERM)
    scontrol requeue / preemption SIGTERM, then SIGKILL after KillWait (30 s by default)
    torchrun, stopping its ranks  SIGTERM to every rank

A signal can arrive in the middle of a backward pass or a collective, where
nothing can be saved. So the handler only sets a flag; the training loop asks
``stop.requested(d)`` after each optimizer step, and all ranks agree (one tiny
all_reduce of the flag) so they checkpoint at the same step and leave together:

    with Preemption() as stop:
        for step ...:
            train_step(...)
            if stop.requested(d):
                checkpoint.save(...)
                break                      # exit 0: the job script requeues the job
"""

from __future__ import annotations

import signal
import threading

import torch
import torch.distributed as tdist

from helpers.dist import Dist, is_initialized

__all__ = ["Preemption", "NoPreemption", "DEFAULT_SIGNALS"]

DEFAULT_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class Preemption:
    """Catch ``signals`` (SIGUSR1, SIGTERM) and remember the first one received."""

    def __init__(self, signals=DEFAULT_SIGNALS):
        self.signals = tuple(signals)
        self.received: str | None = None  # e.g. "SIGUSR1"
        self._previous: dict = {}

    def _handler(self, signum, frame) -> None:
        # Runs between two Python bytecodes of the main thread: only set the flag.
        if self.received is None:
            self.received = signal.Signals(signum).name

    def __enter__(self) -> Preemption:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("Preemption() must be entered in the main thread (signal rules)")
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._previous.items():
            signal.signal(sig, old)
        self._previous.clear()

    def requested(self, d: Dist) -> bool:
        """True on every rank as soon as any rank has received a signal (collective)."""
        flag = torch.tensor([1.0 if self.received else 0.0], device=d.device)
        if is_initialized():
            tdist.all_reduce(flag, op=tdist.ReduceOp.MAX)
        if flag.item() and self.received is None:
            self.received = "a peer's signal"
        return bool(flag.item())


class NoPreemption:
    """Preemption's stand-in when a run cannot be resumed (no checkpoint directory).

    Signals keep their default effect (the run ends), and ``requested`` costs no
    collective.
    """

    received = None

    def __enter__(self) -> NoPreemption:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def requested(self, d: Dist) -> bool:
        return False
