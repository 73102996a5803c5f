"""Lab 6's ranks: a small model with gates in it, the learner's DDP wrapper training it.

On each rank, ``train_watched`` builds ``TinyNet`` seeded by the rank (replicas that start
different), hands it to the learner's wrapper and trains a few SGD steps inside one
``record_traffic`` (every collective but ``all_reduce`` and ``broadcast`` refused by the
test's plan). The model has two **gates** between its layers (helpers.course.grading.
recorder.probe): identity forward; in backward each asks the grading process for a factor
and multiplies the gradient flowing down by it. Each backward is bracketed by two more
requests, "begin" and "end". So the grading process sees, in the order they reached it,
every all-reduce the rank started and every point its backward passed:

* the gradients below a gate depend on a factor that the grading process draws and hands
  over only when backward reaches the gate: a rank cannot compute them first and
  all-reduce everything afterwards, and a bucket all-reduced before its gate carried
  gradients of the layers above it only (what ``ddp_check.check_order`` reads);
* between "begin" and "end" the reply to each all-reduce is held until the rank starts its
  next all-reduce or passes a gate (helpers.course.grading.relay.probes): a hook that waits
  for its all-reduce is failed, with why, however it waits (the CPU its process burns and
  the time it sleeps with a reply held, read from /proc: relay/stall.py). The rank's
  objects are frozen for the garbage collector first, so that a full collection in a
  correct rank's backward does not burn that CPU.

Nothing the rank says about itself is used: no event, note or count. ``single_process`` is
what every rank must end with, given the factors the gates applied (``gates=`` of a
``TinyNet``: a function ``(name, x) -> x`` that applies them).
"""

from __future__ import annotations

import gc
from collections.abc import Callable

import torch
from torch import nn

from helpers.course.grading.recorder import probe
from helpers.course.grading.recorder.traffic import record_traffic

__all__ = ["ALLOWED", "GATES", "TinyNet", "above", "fixed_gates", "single_process", "train_watched"]

ALLOWED = ("all_reduce", "broadcast")
GATES = ("g1", "g2")  # in the order backward meets them: g1 before `out`, g2 before `hidden`


def _no_gate(name: str, x: torch.Tensor) -> torch.Tensor:
    return x


class TinyNet(nn.Module):
    """Odd shapes, a tied weight (embedding = output head), a frozen layer, a buffer, gates."""

    def __init__(self, seed: int, vocab: int = 11, dim: int = 5, hidden: int = 7,
                 gates: Callable = _no_gate):  # fmt: skip
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(vocab, dim)
        self.hidden = nn.Linear(dim, hidden)
        self.frozen = nn.Linear(hidden, hidden).requires_grad_(False)
        self.out = nn.Linear(hidden, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied: one Parameter used twice
        self.register_buffer("shift", torch.randn(hidden))
        self.double()
        self.gates = gates

    def forward(self, tokens):
        x = self.gates("g2", self.embed(tokens).mean(dim=1))
        x = torch.tanh(self.hidden(x) + self.shift)
        x = self.gates("g1", torch.tanh(self.frozen(x)))
        return self.head(self.out(x))


def above(gate: str) -> set[int]:
    """Trainable parameters (their index in TinyNet's order) whose gradients are complete
    when backward reaches ``gate``: out's (3, 4) at g1; hidden's too (1, 2) at g2. The tied
    embedding (0) completes last, after both."""
    return {"g1": {3, 4}, "g2": {1, 2, 3, 4}}[gate]


def batch(step: int, rank: int, size: int = 6, length: int = 3, vocab: int = 11):
    g = torch.Generator().manual_seed(7919 * step + rank)
    return torch.randint(0, vocab, (size, length), generator=g), torch.randint(
        0, vocab, (size,), generator=g
    )


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def flat_state(model: nn.Module) -> torch.Tensor:
    return torch.cat([t.detach().flatten() for t in [*model.parameters(), *model.buffers()]])


@torch.no_grad()
def sgd(model: nn.Module, lr: float) -> None:
    for p in trainable(model):
        p -= lr * p.grad


def train_watched(d, wrap: Callable, steps: int, lr: float, exercise: str = "your DDP") -> dict:
    """On this rank: TinyNet(seed=rank) with the grading process's gates, wrapped by
    ``wrap(model)``, ``steps`` SGD steps on this rank's batches (backward between the
    "begin" and "end" points, ``finish()``, step), all in one recording. Returns the state
    right after wrapping, the gradients after ``finish()`` per step, and the final state
    (flat float64 tensors)."""
    model = TinyNet(seed=1000 + d.rank, gates=probe.gate)
    grads = []
    gc.freeze()  # a full collection in backward scans only what the job made (ms, not 0.1 s)
    with record_traffic(allow=ALLOWED, exercise=exercise):
        net = wrap(model)
        start = flat_state(model)
        for step in range(steps):
            x, y = batch(step, d.rank)
            model.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(net(x), y)
            probe.point("begin")
            loss.backward()
            probe.point("end")
            net.finish()
            grads.append(torch.cat([p.grad.flatten() for p in trainable(model)]))
            sgd(model, lr)
    return {"start": start, "grads": grads, "final": flat_state(model)}


class _Fixed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor.to(grad.dtype), None


def fixed_gates(factors: dict[str, torch.Tensor] | None) -> Callable:
    """Gates that apply ``factors`` ({gate: tensor}; None: none), for the one process."""
    if not factors:
        return _no_gate
    return lambda name, x: _Fixed.apply(x, factors[name])


def single_process(world: int, steps: int, lr: float, factors: list[dict] | None = None) -> dict:
    """What every rank must hold: rank 0's start, trained on all ranks' batches at once, each
    step's backward through the gates' factors of that step (``factors[step]``)."""
    model = TinyNet(seed=1000)
    start, grads, local = flat_state(model), [], []
    for step in range(steps):
        model.gates = fixed_gates(factors[step] if factors else None)
        xs, ys = zip(*[batch(step, r) for r in range(world)], strict=False)
        if step == 0:  # each rank's own gradient, before averaging (what it sends)
            for x, y in zip(xs, ys, strict=False):
                model.zero_grad(set_to_none=True)
                nn.functional.cross_entropy(model(x), y).backward()
                local.append([p.grad.clone() for p in trainable(model)])
        model.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(torch.cat(xs)), torch.cat(ys)).backward()
        grads.append(torch.cat([p.grad.flatten() for p in trainable(model)]))
        sgd(model, lr)
    return {"start": start, "grads": grads, "final": flat_state(model), "local": local,
            "numels": [p.numel() for p in trainable(model)]}  # fmt: skip
