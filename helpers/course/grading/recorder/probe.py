"""What a rank asks of the grading process while a test runs: a memory sample, a gate.

    mark("built")              # the grading process samples this rank's memory now, from
                               # /proc, while the rank waits (helpers.course.grading.recorder.os_memory)
    y = gate("A", x)           # lab 6: identity forward; backward multiplies the gradient by a
                               # factor the grading process draws and hands over only then

Both are requests the rank cannot answer itself: a mark is a sample the grading process
takes, a gate's factor is drawn there and logged in the order the rank's operations
arrived. Under the grader's relay they travel on the rank's relay socket
(helpers.course.grading.relay.backend); in a learner's own kernel on the EventLog's
socket; with neither, a mark does nothing and a gate's factor is 1.
"""

from __future__ import annotations

import torch

from helpers.course.grading.recorder import events

__all__ = ["Gate", "gate", "mark"]


def mark(name: str) -> None:
    """Have the grading process sample this rank's memory now (see the module docstring)."""
    relay = events.relay()
    if relay is not None:
        relay.mark(name)
        return
    out = events.probe()
    if out is not None:
        out.request({"kind": "mark", "name": name})


def factor(name: str, like: torch.Tensor) -> torch.Tensor:
    """The factor of gate ``name`` for a gradient like ``like`` (its last dimension)."""
    numel, dtype = like.shape[-1], like.dtype
    relay = events.relay()
    if relay is not None:
        return relay.gate(name, numel, dtype)
    out = events.probe()
    if out is None:
        return torch.ones(numel, dtype=dtype)
    _, raw = out.request({"kind": "gate", "name": name, "numel": numel,
                          "dtype": str(dtype).removeprefix("torch.")})  # fmt: skip
    return torch.frombuffer(bytearray(raw), dtype=dtype).clone()


class Gate(torch.autograd.Function):
    """Identity forward; backward: the gradient times the grading process's factor."""

    @staticmethod
    def forward(ctx, x, name):
        ctx.name = name
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * factor(ctx.name, grad).to(grad.device), None


def gate(name: str, x: torch.Tensor) -> torch.Tensor:
    """``x`` through gate ``name`` (see the module docstring)."""
    return Gate.apply(x, name)


def point(name: str) -> None:
    """A gate with nothing to multiply: the rank's position, logged (lab 6's begin and end)."""
    factor(name, torch.empty(1, dtype=torch.float64))
