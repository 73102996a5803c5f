"""The recordings a rank has open, as the switch holds them: what to log, refuse and tamper.

A rank's ``record_traffic`` sends an "open" marker (label, content, allow, tamper key) and a
"close" marker over the relay. The switch keeps a stack of them per rank and, for every
operation the rank makes, logs it into each open recording of the grading process's
``EventLog``, refuses a collective that an open recording does not allow, and applies
the recordings' ``Tamper``. A tamper is found by its key among the Tampers made in the
grading process (recorder/tamper.py): a rank names one, it cannot send one. The only events
a rank may report itself are its allocations and the refusals its own recorder made
first; anything else it sends as an event is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from helpers.course.grading.recorder import events
from helpers.course.grading.recorder.tamper import Tamper, registered

__all__ = ["Marks", "Open", "refusal"]


@dataclass
class Open:
    """One recording open on one rank."""

    record: events.Recording | None  # None: no EventLog was open in the grading process
    label: str
    content: bool
    allow: frozenset[str] | None  # None: every collective may run
    tamper: Tamper | None
    seen: int = 0  # operations of the tamper's kind so far


def refusal(label: str, op: str, allow) -> str:
    allowed = f" (allowed here: {', '.join(sorted(allow))})" if allow else ""
    return (
        f"{label} must not call the collective {op!r}{allowed}. Every collective goes through "
        "the grading process, which refuses it. Write it with point-to-point messages: "
        "tdist.send / tdist.recv / tdist.isend / tdist.irecv."
    )


def _text(value, limit: int = 200) -> str:
    return str(value)[:limit]


def _count(value) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass
class Marks:
    """The open recordings of one rank, innermost last, and every operation it made."""

    rank: int
    stack: list[Open] = field(default_factory=list)
    opened: int = 0
    history: list[dict] = field(default_factory=list)  # every operation, recorded or not

    def open(self, header: dict) -> None:
        key = header.get("tamper")
        tamper = None
        if key is not None:
            tamper = registered(key) if isinstance(key, str) else None
            if tamper is None:
                raise ValueError(
                    "record_traffic's tamper is not one the grading process made: build the "
                    "Tamper in the test, not in the rank"
                )
        allow = header.get("allow")
        if allow is not None:
            if not isinstance(allow, list) or not all(isinstance(a, str) for a in allow):
                raise ValueError("allow must be a list of collective names")
            allow = frozenset(allow)
        self.opened += 1
        label = _text(header.get("label", "this exercise"))
        log = events.active_log()
        record = None if log is None else log.begin(self.rank, label, self.opened)
        self.stack.append(Open(record, label, bool(header.get("content")), allow, tamper))

    def close(self) -> None:
        if self.stack:
            done = self.stack.pop()
            if done.record is not None:
                done.record.closed = True

    def reported(self, event, label=None) -> None:
        """An event the rank reports itself: allocations, its own recorder's refusals, and
        lab 6's gradient-ready and hold events (what only the rank's hooks can see)."""
        # Into the recording the rank's sender opened (by its label), else the innermost one.
        mine = [o for o in self.stack if o.label == label] or self.stack[-1:]
        if not mine or not isinstance(event, dict) or mine[-1].record is None:
            return
        kind = event.get("kind")
        if kind == "alloc":
            clean = {"kind": "alloc", "op": _text(event.get("op")),
                     "bytes": _count(event.get("bytes")), "live": _count(event.get("live"))}  # fmt: skip
        elif kind == "kept":
            clean = {
                "kind": "kept",
                "op": _text(event.get("op")),
                "bytes": _count(event.get("bytes")),
            }
        elif kind == "grad":  # lab 6: a gradient became ready (only the rank's hook sees it)
            clean = {"kind": "grad", "param": _count(event.get("param")),
                     "step": _count(event.get("step"))}  # fmt: skip
        elif kind == "held":  # lab 6: the holder's wait for the other ranks' backward
            waiting = event.get("waiting_for")
            clean = {"kind": "held", "ok": event.get("ok") is True, "step": _count(event.get("step")),
                     "waiting_for": [_count(r) for r in waiting] if isinstance(waiting, list) else []}  # fmt: skip
        elif kind == "refused":
            clean = {"kind": "collective", "name": _text(event.get("name")), "op": _text(event.get("name")),
                     "bytes": _count(event.get("bytes")), "allowed": False, "reported": True}  # fmt: skip
        else:
            return
        mine[-1].record.events.append(clean)

    def allowed(self, op: str) -> Open | None:
        """The innermost open recording that refuses ``op``, or None when it may run."""
        for rec in reversed(self.stack):
            if rec.allow is not None and op not in rec.allow:
                return rec
        return None

    def tamper(self, op: str, tensors: list[torch.Tensor], shapes: list[list[int]]) -> list:
        """The tensors this rank puts in, changed by every open recording's matching Tamper."""
        for rec in reversed(self.stack):
            t = rec.tamper
            if t is None or not t.matches(self.rank, op):
                continue
            index, rec.seen = rec.seen, rec.seen + 1
            if t.nth is not None and index != t.nth:
                continue
            tensors = [_changed(t, x, s) for x, s in zip(tensors, shapes, strict=True)]
            if rec.record is not None:
                rec.record.events.append({"kind": "tampered", "op": op, "index": index})
        return tensors

    def log(self, event: dict, shown: torch.Tensor | None) -> None:
        """Log an operation into every open recording (with its tensor where content is on)."""
        self.history.append(event)
        for rec in self.stack:
            if rec.record is not None:
                with_content = rec.content and shown is not None
                rec.record.events.append(
                    {**event, "tensor": shown} if with_content else dict(event)
                )


def _changed(tamper: Tamper, flat: torch.Tensor, shape: list[int]) -> torch.Tensor:
    with torch.no_grad():
        new = tamper.change(flat.view(shape).clone())
    if not isinstance(new, torch.Tensor) or new.numel() != flat.numel():
        raise ValueError(f"the tamper's change must keep the message's shape {tuple(shape)}")
    return new.detach().to(flat.dtype).reshape(-1).contiguous()
