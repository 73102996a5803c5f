"""One rank's state at the switch: its recordings, what to log, refuse and tamper.

The test's plan (helpers.course.grading.recorder.plan, from the EventLog open in the
grading process) decides: which collectives may run anywhere in the job, whether contents
are kept, which messages change, whether memory is measured. A rank's "open" and "close"
markers only delimit its recordings: each operation is logged into every recording open
at that moment, or into the log's list of operations outside every recording, so an early
close or a missing open moves an operation, never hides it. A recording's own allow list
(the rank's recorder names what the exercise may call) can refuse more than the plan,
never less. A tamper's ``case`` is the index of the rank's top-level recording.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from helpers.course.grading.recorder.plan import Counter, Plan
from helpers.course.grading.recorder.recording import Recording

__all__ = ["Marks", "Open", "refusal"]


@dataclass
class Open:
    """One recording open on one rank."""

    record: Recording | None  # None: no EventLog was open in the grading process
    label: str
    allow: frozenset[str] | None  # the rank's own list (None: no list of its own)
    case: int  # its index among the rank's top-level recordings


def refusal(label: str, op: str, allow) -> str:
    allowed = f" (allowed here: {', '.join(sorted(allow))})" if allow else ""
    return (
        f"{label} must not call the collective {op!r}{allowed}. Every collective goes through "
        "the grading process, which refuses it. Write it with point-to-point messages: "
        "tdist.send / tdist.recv / tdist.isend / tdist.irecv."
    )


def _text(value, limit: int = 200) -> str:
    return str(value)[:limit]


@dataclass
class Marks:
    """The open recordings of one rank, innermost last, and every operation it made."""

    rank: int
    log: object = None  # the EventLog open in the grading process, or None
    plan: Plan = field(default_factory=Plan)
    stack: list[Open] = field(default_factory=list)
    opened: int = 0  # recordings opened, nested ones included (their order, seq)
    cases: int = 0  # top-level recordings opened
    history: list[dict] = field(default_factory=list)  # every operation, recorded or not

    def __post_init__(self) -> None:
        self.counter = Counter(self.rank, self.plan.tamper)

    def open(self, header: dict) -> Open:
        allow = header.get("allow")
        if allow is not None:
            if not isinstance(allow, list) or not all(isinstance(a, str) for a in allow):
                raise ValueError("allow must be a list of collective names")
            allow = frozenset(allow)
        self.opened += 1
        case = self.stack[0].case if self.stack else self.cases
        if not self.stack:
            self.cases += 1
        label = _text(header.get("label", "this exercise"))
        record = None if self.log is None else self.log.begin(self.rank, label, self.opened)
        self.stack.append(Open(record, label, allow, case))
        return self.stack[-1]

    def close(self) -> Open | None:
        if not self.stack:
            return None
        done = self.stack.pop()
        if done.record is not None:
            done.record.closed = True
        return done

    @property
    def case(self) -> int | None:
        """The index of the top-level recording open now (None: outside every one)."""
        return self.stack[0].case if self.stack else None

    def refused(self, op: str) -> str | None:
        """Why ``op`` may not run now (the plan's rule first), or None when it may."""
        if self.plan.refuses(op):
            label = self.stack[-1].label if self.stack else "this test"
            return refusal(label, op, self.plan.allow)
        for rec in reversed(self.stack):
            if rec.allow is not None and op not in rec.allow:
                return refusal(rec.label, op, rec.allow)
        return None

    def tamper(self, op: str, tensors: list[torch.Tensor], shapes: list[list[int]]) -> list:
        """The tensors this rank puts in, changed by every tamper of the plan due now."""
        for t, index in self.counter.due(op, self.case):
            tensors = [_changed(t, x, s) for x, s in zip(tensors, shapes, strict=True)]
            self.note({"kind": "tampered", "op": op, "index": index})
        return tensors

    def note(self, event: dict) -> None:
        """An event of the grading process about this rank (a tamper, a gate, a sample):
        into every open recording, or the log's list of what ran outside them."""
        recs = [o.record for o in self.stack if o.record is not None]
        for rec in recs:
            rec.events.append(event)
        if not self.stack and self.log is not None and event["kind"] != "mark":
            self.log.outside_event(self.rank, event)

    def log_op(self, event: dict, shown: torch.Tensor | None) -> None:
        """Log an operation (with its tensor when the plan keeps contents)."""
        self.history.append(event)
        full = {**event, "tensor": shown} if self.plan.content and shown is not None else event
        self.note(dict(full))


def _changed(tamper, flat: torch.Tensor, shape: list[int]) -> torch.Tensor:
    with torch.no_grad():
        new = tamper.change(flat.view(shape).clone())
    if not isinstance(new, torch.Tensor) or new.numel() != flat.numel():
        raise ValueError(f"the tamper's change must keep the message's shape {tuple(shape)}")
    return new.detach().to(flat.dtype).reshape(-1).contiguous()
