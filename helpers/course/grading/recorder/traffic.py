"""Record a rank's traffic, refuse collectives, stream every event out, for the lab tests.

A "by hand" exercise (lab 1's ring all-reduce) is graded on HOW it works, not
only on its result: which messages a rank sent, to whom, how many bytes, and
what they held. ``record_traffic`` watches one rank while the learner's code runs::

    with record_traffic(exercise="the ring all-reduce") as traffic:
        ring_all_reduce_(d, tensor)
    traffic.messages   # [Message(op='isend', peer=1, numel=3, bytes=12), ...]

How: every torch.distributed operation, whatever Python path reaches it
(``tdist.all_reduce``, ``distributed_c10d.all_reduce``, ``all_reduce_coalesced``,
object collectives, a ``ProcessGroup`` method, functional collectives), ends up
as one operator of the ``c10d`` namespaces in PyTorch's dispatcher. A
``TorchDispatchMode`` sees each of them: ``c10d.send`` / ``c10d.recv_`` are
logged as messages, any other one raises ``CollectiveRefused`` before it runs
(unless ``allow`` names it). An allowed collective is logged with the bytes this
rank put in (``traffic.calls``). The workbook's own ready-made all-reduces
(helpers.parallel.collectives.collectives) are refused too.

Beyond the rank's own lists, which the learner's code could reach:

* with an ``EventLog`` open in the grading process (helpers.course.grading.recorder.events), every
  event is also streamed there as it happens; tests grade that copy, so
  changing the rank's lists afterwards changes nothing, and a recorder that was
  switched off leaves fewer events than the maths requires;
* ``content=True`` streams what each send and each collective contribution held;
* ``tamper=Tamper(...)`` changes one message on its way (helpers.course.grading.recorder.tamper);
* ``memory=True`` counts the tensor bytes allocated inside the recording
  (helpers.course.grading.recorder.allocations): ``traffic.peak_bytes``, ``traffic.kept_bytes``.

Under the grader's sandbox the rank's process group is the relay
(helpers.course.grading.relay): every collective and message passes through the grading
process, which logs it, refuses what ``allow`` does not name and applies the tamper
itself. There the recorder only sends the recording's start and end (and the allocations
and its own friendly refusals) over the relay; the rank's own ``Traffic`` lists are kept
as before. With gloo (a learner's own kernel) it works as described above.
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
from helpers.course.grading.recorder.tamper import Tamper, contribution, substitute
from helpers.launch import RankFailure, spawn

__all__ = [
    "Call",
    "CollectiveRefused",
    "EventLog",
    "Message",
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

    def __init__(self, traffic, allow, exercise, out, content, tamper, memory):
        super().__init__()
        self.relayed = False  # True: the relay's switch logs, refuses and tampers (not this rank)
        self.traffic, self.allow, self.exercise = traffic, frozenset(allow), exercise
        self.out, self.content, self.tamper = out, content, tamper
        self.memory = Allocations(on_alloc=self._emit) if memory else None
        self.api = threading.local()  # the Python function being called (isend, recv, ...)
        self.tamper_seen = 0  # operations of the tamper's kind seen so far on this rank
        self.rank = tdist.get_rank() if tdist.is_initialized() else -1

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
        if name in P2P:
            op = self._p2p_name(name)
        else:
            op = FRIENDLY.get(name, name)
        if self.relayed:
            return self._relayed(name, op, func, args, kwargs)
        if self.tamper is not None and self.tamper.matches(self.rank, op):
            index, self.tamper_seen = self.tamper_seen, self.tamper_seen + 1
            if self.tamper.nth is None or index == self.tamper.nth:
                args, kwargs = substitute(func, args, kwargs, self.tamper.change)
                self.traffic.tampered += 1
                self._emit({"kind": "tampered", "op": op, "index": index})
        _, tensors = contribution(func, args, kwargs)
        numel = sum(t.numel() for t in tensors)
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        shown = tensors[0] if len(tensors) == 1 else None
        if name in P2P:
            peer = int(args[2]) if name != "recv_any_source_" else -1
            self.traffic.messages.append(Message(op, peer, numel, nbytes))
            event = {"kind": "p2p", "op": op, "peer": peer, "numel": numel, "bytes": nbytes}
            outgoing = op in ("send", "isend")
            self._emit(event, shown if self.content and outgoing else None)
            return args, kwargs
        allowed = op in self.allow
        event = {"kind": "collective", "name": op, "bytes": nbytes, "allowed": allowed}
        self._emit(event, shown if self.content and allowed else None)
        if not allowed:
            raise CollectiveRefused(_refusal(self.exercise, op, func.namespace, self.allow))
        self.traffic.collectives.append(op)
        self.traffic.calls.append(Call(op, nbytes))
        return args, kwargs

    def _relayed(self, name, op, func, args, kwargs):
        """Under the relay: keep this rank's own lists, refuse early with a clear message."""
        _, tensors = contribution(func, args, kwargs)
        numel = sum(t.numel() for t in tensors)
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        if name in P2P:
            peer = int(args[2]) if name != "recv_any_source_" else -1
            self.traffic.messages.append(Message(op, peer, numel, nbytes))
            return args, kwargs
        if op not in self.allow:
            self._emit({"kind": "refused", "name": op, "bytes": nbytes})
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
    exercise: how refusal messages name the code under test.
    content: also stream what each send and each allowed collective carried.
    tamper: change one message on its way (helpers.course.grading.recorder.tamper.Tamper).
    memory: count the tensor bytes allocated inside (peak_bytes, kept_bytes).
    Raises RuntimeError at exit if the recording was switched off from inside.
    """
    traffic = Traffic()
    watch = _Watch(traffic, allow, exercise, None, content, tamper, memory)
    relayed = events.relay_markers(exercise, content, allow, tamper, watch.api)
    watch.relayed = relayed is not None
    out = watch.out = relayed if watch.relayed else events.sender(exercise)
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
            traffic.peak_bytes, traffic.kept_bytes = watch.memory.peak_bytes, 0
            for op, nbytes in watch.memory.kept():
                traffic.kept_bytes += nbytes
                watch._emit({"kind": "kept", "op": op, "bytes": nbytes})
    finally:
        if out is not None:
            out.close()


def streamed(recording: events.Recording) -> Traffic:
    """The Traffic of one recording as the grading process received it (an EventLog's copy)."""
    traffic = Traffic(tampered=len(recording.tampered))
    for e in recording.messages:
        traffic.messages.append(Message(e["op"], e["peer"], e["numel"], e["bytes"]))
    for name, nbytes in recording.calls:
        traffic.collectives.append(name)
        traffic.calls.append(Call(name, nbytes))
    traffic.peak_bytes, traffic.kept_bytes = recording.peak_bytes, recording.kept_bytes
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
