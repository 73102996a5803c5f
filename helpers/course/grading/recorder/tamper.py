"""Change one message on its way, to see whether the learner's result depends on it.

A decoy sends the right shapes (or even the right values) while the real work
travels another way: through files, or a second copy of the model on every rank.
Checking what messages hold is not enough against a decoy that sends the right
values and ignores what it receives. So a test changes a message in flight and
asserts that the result changes exactly as the maths says::

    double = Tamper(rank=1, op="all_reduce", change=lambda t: 2 * t, case=3)
    with EventLog(allow=["all_reduce"], tamper=[double]):    # the grading process's plan
        out = spawn(on_ranks, world_size=4, args=(cases,))  # the ranks never see it
    # in case 3, every rank's mean is (S + S_1) / (n + n_1): rank 1's part counted twice

``rank``: the rank whose message changes; ``op``: which operations (a name such as
``"send"`` or ``"all_reduce"``, or a tuple of names); ``case``: the index of the rank's
recording (its ``record_traffic`` blocks, in order, from 0) the change applies in (None:
anywhere in the job); ``nth``: the index among the operations of that kind in that
recording, or in the job (0: the first; None: every one); ``change``: the new message
from the old one (same shape and dtype). What this rank puts into a collective (its
contribution) changes: an all-reduce's tensor in place, a send's or an all-gather's input
as a new tensor (the sender's own copy is untouched).

The plan lives in the grading process: under the grader's relay the switch applies it to
the bytes it carries, and no rank is told which message will change, or how
(helpers.course.grading.relay). With gloo (a learner's own kernel, the instructors' runs
of the solutions) the rank's own recorder applies the same plan, read from the open
EventLog (helpers.course.grading.recorder.events).

Also here: which argument of each ``c10d`` operator is this rank's contribution.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Tamper", "contribution", "substitute"]

# Schema argument names, in order of preference, that hold what this rank puts in.
_INPUT_NAMES = (
    "input", "input_tensor", "input_tensors", "inputs", "input_list", "tensors", "tensor", "self",
)  # fmt: skip
# Operators that write their result into the tensor they read (change it in place).
_IN_PLACE = {"allreduce_", "allreduce_coalesced_", "broadcast_", "all_reduce_", "reduce_"}


@dataclass
class Tamper:
    rank: int
    op: str | tuple[str, ...]
    change: Callable[[torch.Tensor], torch.Tensor]
    nth: int | None = 0
    case: int | None = None  # the rank's recording it applies in (None: the whole job)

    def matches(self, rank: int, op: str) -> bool:
        """Is this operation of this rank one of the kind counted by ``nth``?"""
        ops = (self.op,) if isinstance(self.op, str) else self.op
        return rank == self.rank and op in ops


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


def contribution(func, args, kwargs) -> tuple[str | None, list[torch.Tensor]]:
    """(schema name, tensors) of what this rank puts into the operator ``func``."""
    names = [a.name for a in func._schema.arguments]
    values = dict(zip(names, args, strict=False)) | (kwargs or {})
    for name in _INPUT_NAMES:
        if name in values:
            return name, _tensors(values[name])
    for name, value in values.items():
        if found := _tensors(value):
            return name, found
    return None, []


def substitute(func, args, kwargs, change) -> tuple[tuple, dict]:
    """args and kwargs with this rank's contribution changed by ``change``."""
    op = func._schema.name.split("::")[-1]
    name, tensors = contribution(func, args, kwargs)
    if name is None:
        return args, kwargs
    if op in _IN_PLACE:
        with torch.no_grad():
            for t in tensors:
                t.copy_(change(t.clone()))
        return args, kwargs
    names = [a.name for a in func._schema.arguments]

    def replaced(value):
        if isinstance(value, torch.Tensor):
            return change(value.detach().clone())
        if isinstance(value, list | tuple):
            return type(value)(replaced(v) for v in value)
        return value

    if name in (kwargs or {}):
        return args, {**kwargs, name: replaced(kwargs[name])}
    i = names.index(name)
    return (*args[:i], replaced(args[i]), *args[i + 1 :]), kwargs
