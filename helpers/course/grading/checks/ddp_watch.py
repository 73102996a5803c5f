"""Lab 6's ranks, watched: a small model, the learner's DDP wrapper training it, each event streamed.

On each rank, ``train_watched`` builds ``TinyNet`` seeded by the rank (replicas that start
different), hands it to the learner's wrapper and trains a few SGD steps, while:

* ``record_traffic`` refuses every collective but ``all_reduce`` and ``broadcast``, streams
  what each all-reduce carried to the grading process, and can change one message on its way
  (``Tamper``);
* a second stream, on one socket so that its order is the order things happened, says when
  each gradient became ready (a post-accumulate-grad hook registered on every trainable
  parameter *before* the learner's, so it fires first) and when each collective was issued;
* in each of the first two steps one rank, the *holder* (rank 1 in step 0, rank 0 in step 1),
  holds its first gradient hook until every other rank's ``backward()`` has returned (at most
  ``HOLD_S``). A wrapper whose hooks wait for their all-reduce blocks those ranks inside
  backward until the holder joins: the holder then reports that it waited in vain. Two steps,
  so that every rank's hooks are checked, rank 0's and rank 1's included (a wrapper that
  waits on every rank but one is caught).

``single_process`` is what every rank must end with. The grader's side is
helpers.course.grading.checks.ddp_check.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.course.grading.recorder import events
from helpers.course.grading.recorder.traffic import Tamper, record_traffic

__all__ = ["HOLD_S", "TinyNet", "single_process", "train_watched"]

HOLD_S = 4.0  # how long the holder waits for the other ranks' backward to return
HOLD_STEPS = 2  # steps with a holder: rank 1 in step 0, rank 0 in step 1


def holder(step: int) -> int:
    """The rank that holds its first gradient hook in ``step`` (< HOLD_STEPS)."""
    return 1 if step == 0 else 0


def returned_flag(flags: str, step: int, rank: int) -> str:
    """The file rank creates once its ``backward()`` of ``step`` has returned."""
    return f"{flags}-s{step}-r{rank}"


class TinyNet(nn.Module):
    """Odd shapes, a tied weight (embedding = output head), a frozen layer and a buffer."""

    def __init__(self, seed: int, vocab: int = 11, dim: int = 5, hidden: int = 7):
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

    def forward(self, tokens):
        x = self.embed(tokens).mean(dim=1)
        x = torch.tanh(self.hidden(x) + self.shift)
        x = torch.tanh(self.frozen(x))
        return self.head(self.out(x))


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


class _Order(TorchDispatchMode):
    """Streams each all-reduce and broadcast as it is issued (the op before it runs)."""

    def __init__(self, out):
        super().__init__()
        self.out = out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        if (
            self.out is not None
            and func.namespace == "c10d"
            and name in ("allreduce_", "broadcast_")
        ):
            numel = sum(t.numel() for t in args[0])
            self.out.send(
                {
                    "kind": "op",
                    "op": name.rstrip("_").replace("allreduce", "all_reduce"),
                    "numel": numel,
                }
            )
        return func(*args, **(kwargs or {}))


def _returned(flags: str, step: int, ranks: list[int]) -> list[int]:
    """Of ``ranks``, those whose backward of ``step`` has returned: under the grader's relay,
    the notes they posted there (sandboxed ranks share no file); otherwise, their flag files."""
    from helpers.course.grading.relay import backend as relay

    if relay.active():
        notes = {f"rank {r}: backward returned in step {step}": r for r in ranks}
        return [notes[k] for k in relay.noted(notes)]
    return [r for r in ranks if os.path.exists(returned_flag(flags, step, r))]


def _say_returned(flags: str, step: int, rank: int) -> None:
    from helpers.course.grading.relay import backend as relay

    if relay.active():
        relay.note(f"backward returned in step {step}")
    else:
        open(returned_flag(flags, step, rank), "w").close()


def _hold(flags: str, step: int, rank: int, world: int) -> list[int]:
    """Wait (at most HOLD_S) until every other rank's backward of ``step`` has returned; the
    ranks whose backward had not returned by then."""
    others = [r for r in range(world) if r != rank]
    deadline = time.monotonic() + HOLD_S
    while time.monotonic() < deadline:
        missing = sorted(set(others) - set(_returned(flags, step, others)))
        if not missing:
            return []
        time.sleep(0.005)
    return sorted(set(others) - set(_returned(flags, step, others)))


def _watch_grads(params, out, rank: int, world: int, flags: str | None) -> list:
    """Hooks, registered before the learner's: stream 'grad i'; in step s < HOLD_STEPS the
    holder(s) holds its first (unless flags is None) until the other ranks' backward returned."""
    state = {"step": 0, "first": flags is not None and world > 1, "held_ok": True}

    def make(i):
        def hook(p):
            step = state["step"]
            if out is not None:
                out.send({"kind": "grad", "param": i, "step": step})
            if state["first"] and step < HOLD_STEPS and rank == holder(step):
                state["first"] = False  # once per step: train_watched sets it again
                missing = _hold(flags, step, rank, world)
                state["held_ok"] = state["held_ok"] and not missing
                if out is not None:
                    out.send(
                        {"kind": "held", "ok": not missing, "step": step, "waiting_for": missing}
                    )

        return hook

    return [p.register_post_accumulate_grad_hook(make(i)) for i, p in enumerate(params)], state


def train_watched(d, wrap: Callable, steps: int, lr: float, flags: str | None, tamper: Tamper | None = None,
                  exercise: str = "your DDP") -> dict:  # fmt: skip
    """On this rank: TinyNet(seed=rank) wrapped by ``wrap(model)``, ``steps`` SGD steps on
    this rank's batches (backward, ``finish()``, step), watched as the module docstring says.
    Returns the state right after wrapping, the gradients after ``finish()`` per step, and
    the final state (all flat float64 tensors)."""
    model = TinyNet(seed=1000 + d.rank)
    out = events.sender(f"{exercise} order")
    handles, state = _watch_grads(trainable(model), out, d.rank, d.world_size, flags)
    grads = []
    try:
        with record_traffic(
            allow=("all_reduce", "broadcast"), exercise=exercise, content=True, tamper=tamper
        ):
            with _Order(out):
                net = wrap(model)
                start = flat_state(model)
                for step in range(steps):
                    state["step"] = step
                    state["first"] = flags is not None and d.world_size > 1 and state["held_ok"]
                    x, y = batch(step, d.rank)
                    model.zero_grad(set_to_none=True)
                    nn.functional.cross_entropy(net(x), y).backward()
                    if flags is not None and step < HOLD_STEPS and d.rank != holder(step):
                        _say_returned(flags, step, d.rank)  # backward returned
                    net.finish()
                    grads.append(torch.cat([p.grad.flatten() for p in trainable(model)]))
                    sgd(model, lr)
    finally:
        for h in handles:
            h.remove()
        if out is not None:
            out.close()
    return {"start": start, "grads": grads, "final": flat_state(model), "held_ok": state["held_ok"]}


def single_process(world: int, steps: int, lr: float) -> dict:
    """What every rank must hold: rank 0's start, trained on all ranks' batches at once."""
    model = TinyNet(seed=1000)
    start, grads, local = flat_state(model), [], []
    for step in range(steps):
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
