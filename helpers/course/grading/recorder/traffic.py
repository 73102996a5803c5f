"""Record a rank's traffic, refuse collectives, mark the code under test, for the lab tests.

A "by hand" exercise (lab 1's ring all-reduce) is graded on HOW it works, not
only on its result: which messages a rank sent, to whom, how many bytes, and
what they held. ``record_traffic`` marks the code under test on one rank::

    with record_traffic(exercise="the ring all-reduce") as traffic:
        ring_all_reduce_(d, tensor)
    traffic.messages   # this rank's own list: [Message(op='isend', peer=1, numel=3, bytes=12), ...]

What a test grades is never this list (the learner's code shares the rank's process and
could change it) but the grading process's log (helpers.course.grading.recorder.events):

* Under the grader's sandbox the rank's process group is the relay
  (helpers.course.grading.relay): every collective and message passes through the
  grading process, which logs it, refuses the collectives the test's plan does not
  allow, applies the plan's tampers and, when asked, samples the rank's memory from the
  operating system. The recorder only tells the switch where a recording starts and ends
  and what it is called; it carries no allow, tamper or content of its own there. A rank
  that closes its recording early or never opens one only moves its operations to
  another recording, or outside every one, where the log lists them too.
* With gloo (a learner's own kernel, the instructors' runs) the rank's recorder does the
  work itself: a ``TorchDispatchMode`` sees every operator of the ``c10d`` namespaces
  (whatever Python path reaches it), logs ``c10d.send`` / ``c10d.recv_`` as messages,
  refuses any other one that ``allow`` (narrowed by the plan's) does not name, applies the
  plan's tampers for this recording and streams each event to the open EventLog as it
  happens. The workbook's own ready-made all-reduces are refused too.

``allow``: friendly collective names that may run (e.g. ``("all_reduce",)``), counted in
``traffic.collectives``; ``content`` and ``tamper``: for a learner's own kernel (the
plan's ``content`` and ``tamper`` are what tests use); ``memory=True``: count this rank's
own tensor bytes into ``traffic.peak_bytes`` / ``kept_bytes`` (a demonstration: no test
believes it; the grading process measures memory itself).
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch.distributed as tdist
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from helpers.course.grading.recorder import events
from helpers.course.grading.recorder.allocations import Allocations
from helpers.course.grading.recorder.c10d import (
    C10D_NAMESPACES,
    FRIENDLY,
    P2P,
    named_p2p,
    refuse_workbook_collectives,
)
from helpers.course.grading.recorder.events import EventLog
from helpers.course.grading.recorder.plan import Counter, allowed_by
from helpers.course.grading.recorder.recording import Recording
from helpers.course.grading.recorder.tamper import Tamper, contribution, substitute
from helpers.launch import RankFailure, spawn

__all__ = [
    "Call",
    "CollectiveRefused",
    "EventLog",
    "Message",
    "Recording",
    "Tamper",
    "Traffic",
    "record_traffic",
    "spawn_p2p",
    "streamed",
]


class CollectiveRefused(RuntimeError):
    """A collective was called where the exercise allows point-to-point messages only."""


@dataclass(frozen=True)
class Message:
    """One point-to-point operation of this rank: op is send, isend, recv or irecv."""

    op: str
    peer: int  # the other rank (-1: a receive from any source)
    numel: int
    bytes: int

    @property
    def outgoing(self) -> bool:
        return self.op in ("send", "isend")


@dataclass(frozen=True)
class Call:
    """One allowed collective of this rank: its name and the bytes this rank put in
    (an all-reduce's tensor, an all-gather's own piece)."""

    name: str
    bytes: int


@dataclass
class Traffic:
    """What one rank did while recorded: its messages and the allowed collectives it ran."""

    messages: list[Message] = field(default_factory=list)
    collectives: list[str] = field(default_factory=list)  # friendly names, in call order
    calls: list[Call] = field(default_factory=list)  # the same collectives, with their bytes
    tampered: int = 0  # messages changed on their way (record_traffic's tamper=)
    peak_bytes: int = 0  # with memory=True: most bytes of new tensors alive at once
    kept_bytes: int = 0  # with memory=True: bytes of new tensors alive at the end

    def sent(self) -> list[Message]:
        return [m for m in self.messages if m.outgoing]

    def received(self) -> list[Message]:
        return [m for m in self.messages if not m.outgoing]

    def elements_sent(self) -> int:
        return sum(m.numel for m in self.sent())

    def elements_received(self) -> int:
        return sum(m.numel for m in self.received())

    def bytes_sent(self) -> int:
        return sum(m.bytes for m in self.sent())


class _Watch(TorchDispatchMode):
    """Sees every dispatched operator; logs c10d p2p ops, refuses the other c10d ops."""

    def __init__(self, traffic, allow, exercise, out, content, tampers, memory):
        super().__init__()
        self.relayed = False  # True: the relay's switch logs, refuses and tampers (not this rank)
        self.traffic, self.allow, self.exercise = traffic, allow, exercise
        self.out, self.content, self.tampers = out, content, tampers
        self.memory = Allocations() if memory else None
        self.api = threading.local()  # the Python function being called (isend, recv, ...)

    def _emit(self, event: dict, content=None) -> None:
        if self.out is not None:
            self.out.send(event, content)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace in C10D_NAMESPACES:
            args, kwargs = self._c10d(func, args, kwargs)
            if self.memory is not None:
                self.memory.communicated((args, kwargs))
        if self.memory is None:
            return func(*args, **kwargs)
        self.memory.seen((args, kwargs))
        out = func(*args, **kwargs)
        self.memory.made(str(func.overloadpacket.__name__), out)
        return out

    def _c10d(self, func, args, kwargs):
        name = func._schema.name.split("::")[-1]
        op = self._p2p_name(name) if name in P2P else FRIENDLY.get(name, name)
        if not self.relayed:
            for t, index in self.tampers(op):
                args, kwargs = substitute(func, args, kwargs, t.change)
                self.traffic.tampered += 1
                self._emit({"kind": "tampered", "op": op, "index": index})
        _, tensors = contribution(func, args, kwargs)
        numel = sum(t.numel() for t in tensors)
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        shown = tensors[0] if len(tensors) == 1 else None
        if name in P2P:
            peer = int(args[2]) if name != "recv_any_source_" else -1
            self.traffic.messages.append(Message(op, peer, numel, nbytes))
            if not self.relayed:
                event = {"kind": "p2p", "op": op, "peer": peer, "numel": numel, "bytes": nbytes}
                outgoing = op in ("send", "isend")
                self._emit(event, shown if self.content and outgoing else None)
            return args, kwargs
        allowed = self.allow is None or op in self.allow
        if not self.relayed:
            event = {"kind": "collective", "name": op, "op": op, "bytes": nbytes,
                     "numel": numel, "allowed": allowed}  # fmt: skip
            self._emit(event, shown if self.content and allowed else None)
        if not allowed:
            raise CollectiveRefused(_refusal(self.exercise, op, func.namespace, self.allow))
        self.traffic.collectives.append(op)
        self.traffic.calls.append(Call(op, nbytes))
        return args, kwargs

    def _p2p_name(self, name: str) -> str:
        base = P2P[name]
        api = getattr(self.api, "name", None)
        return api if api and api.endswith(base) else base  # isend/irecv when called so


def _refusal(exercise: str, name: str, namespace: str, allow: Iterable[str]) -> str:
    allowed = f" (allowed here: {', '.join(sorted(allow))})" if allow else ""
    return (
        f"{exercise} must not call the collective {name!r} ({namespace}.{name}){allowed}. "
        "Every path to it is watched: torch.distributed, distributed_c10d, object "
        "collectives, ProcessGroup methods. Write it with point-to-point messages: "
        "tdist.send / tdist.recv / tdist.isend / tdist.irecv."
    )


_CASES: dict[str, list] = {}  # kernel world: EventLog address -> [recordings opened, Counter]


def _planned_tampers(plan, own: Tamper | None):
    """Kernel world: the tampers of this recording (the plan's, counted over the job in this
    process, and the rank's own ``tamper=``, counted in this recording)."""
    rank = tdist.get_rank() if tdist.is_initialized() else -1
    where = events.address() or ""
    state = _CASES.setdefault(where, [0, Counter(rank, plan.tamper)])
    case, state[0] = state[0], state[0] + 1
    mine = Counter(rank, () if own is None else (own,))

    def due(op: str):
        return [*state[1].due(op, case), *mine.due(op, None)]

    return due


@contextlib.contextmanager
def record_traffic(
    allow: Iterable[str] = (),
    exercise: str = "this exercise",
    content: bool = False,
    tamper: Tamper | None = None,
    memory: bool = False,
) -> Iterator[Traffic]:
    """Record this rank's p2p messages; refuse every collective not named in ``allow``.

    allow: friendly collective names that may run and are counted in
        ``traffic.collectives`` (e.g. ``("all_reduce",)``).
    exercise: how refusal messages and the log name the code under test.
    content, tamper: without the relay only (see the module docstring).
    memory: this rank's own count of its tensor bytes (peak_bytes, kept_bytes).
    Raises RuntimeError at exit if the recording was switched off from inside.
    """
    traffic = Traffic()
    api = threading.local()
    relayed = events.relay_markers(exercise, sorted(allow), api)
    if relayed is not None:
        watch = _Watch(traffic, frozenset(allow), exercise, relayed, False, None, memory)
        watch.relayed, out = True, relayed
    else:
        plan = events.planned()
        out = events.sender(exercise, sync=plan.memory)
        watch = _Watch(traffic, allowed_by(plan, allow), exercise, out, content or plan.content,
                       _planned_tampers(plan, tamper), memory)  # fmt: skip
        events.opened(out)
    watch.api = api
    try:
        with refuse_workbook_collectives(exercise), named_p2p(watch.api):
            with watch:
                yield traffic
                if _get_current_dispatch_mode() is not watch:
                    raise RuntimeError(
                        f"{exercise} switched off the traffic recorder (a dispatch mode was "
                        "pushed or popped): leave torch's dispatch modes alone"
                    )
        if watch.memory is not None:
            gc.collect()  # what a reference cycle still holds is not kept by the learner's code
            traffic.peak_bytes = watch.memory.peak_bytes
            traffic.kept_bytes = sum(nbytes for _, nbytes in watch.memory.kept())
    finally:
        events.closed(out)
        if out is not None:
            out.close()


def streamed(recording: Recording) -> Traffic:
    """The Traffic of one recording as the grading process logged it (an EventLog's copy);
    its memory figures are left at 0 (the recording's own ``peak_bytes`` and ``kept_bytes``
    are the grading process's measures)."""
    traffic = Traffic(tampered=len(recording.tampered))
    for e in recording.messages:
        traffic.messages.append(Message(e["op"], e["peer"], e["numel"], e["bytes"]))
    for name, nbytes in recording.calls:
        traffic.collectives.append(name)
        traffic.calls.append(Call(name, nbytes))
    return traffic


def spawn_p2p(fn, world_size: int, args=(), timeout: float = 15) -> list:
    """spawn(fn, world_size, args) for send/recv code: a hang fails with a hint, in ~timeout s.

    A blocking ``send`` waits until the neighbour receives (gloo and NCCL both may):
    if every rank sends first, they all wait for each other for ever.
    """
    try:
        return spawn(fn, world_size=world_size, args=args, timeout=timeout)
    except RankFailure as e:
        if "timed out" not in str(e):
            raise
        raise AssertionError(
            f"the ranks did not finish in {timeout:g} s: a deadlock. If every rank calls the "
            "blocking tdist.send before its tdist.recv, each one waits for its neighbour to "
            "receive while that neighbour is itself stuck sending. Post each step's send and "
            "receive as one tdist.batch_isend_irecv([tdist.P2POp(tdist.isend, ...), "
            "tdist.P2POp(tdist.irecv, ...)]) and wait on its requests, or let even ranks send "
            "first and odd ranks receive first (an isend then a recv hangs on 2 GPUs: NCCL's rule)."
        ) from None
