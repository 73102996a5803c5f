"""Record a rank's point-to-point traffic and refuse collectives, for the lab tests.

A "by hand" exercise (lab 1's ring all-reduce) is graded on HOW it works, not
only on its result: which messages a rank sent, to whom, and how many bytes.
``record_traffic`` watches one rank while the learner's function runs::

    with record_traffic(exercise="the ring all-reduce") as traffic:
        ring_all_reduce_(d, tensor)
    traffic.messages   # [Message(op='isend', peer=1, numel=3, bytes=12), ...]
    ring_problems(traffic, d.rank, d.world_size, tensor.numel())   # [] for a real ring
                                                  # (helpers.course.ring_check)

How: every torch.distributed operation, whatever Python path reaches it
(``tdist.all_reduce``, ``distributed_c10d.all_reduce``, ``all_reduce_coalesced``,
object collectives, a ``ProcessGroup`` method, functional collectives), ends
up as one operator of the ``c10d`` namespaces in PyTorch's dispatcher. A
``TorchDispatchMode`` sees each of them: ``c10d.send`` / ``c10d.recv_`` are
logged as messages, any other one raises ``CollectiveRefused`` before it runs
(unless ``allow`` names it; lab 0 allows and counts ``all_reduce``). An allowed
collective is logged with the bytes this rank put in (``traffic.calls``), so lab 4
checks that a layer all-reduces one [B, T, dim] tensor, not two, nor a wider one.
The workbook's own ready-made all-reduces (helpers.parallel.collectives, built
from send/recv) are refused too: their code objects are swapped while recording,
so even a reference imported before the recording started is caught.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch.distributed as tdist
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from helpers.launch import RankFailure, spawn

__all__ = [
    "Call",
    "CollectiveRefused",
    "Message",
    "Traffic",
    "record_traffic",
    "spawn_p2p",
]

# Dispatcher namespaces of distributed operators, and the point-to-point ones in them.
_C10D_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd")
_P2P = {"send": "send", "recv_": "recv", "recv_any_source_": "recv"}
# Operator name -> the torch.distributed function a learner knows it by.
_FRIENDLY = {
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce_coalesced",
    "allgather_": "all_gather",
    "_allgather_base_": "all_gather_into_tensor",
    "allgather_coalesced_": "all_gather_coalesced",
    "allgather_into_tensor_coalesced_": "all_gather_into_tensor_coalesced",
    "broadcast_": "broadcast",
    "reduce_": "reduce",
    "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter_tensor",
    "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all_single",
    "gather_": "gather",
    "scatter_": "scatter",
    "barrier": "barrier",
    "monitored_barrier_": "monitored_barrier",
}
# Python entry points whose name tells isend from send (the dispatcher sees only send).
_P2P_FUNCTIONS = ("send", "recv", "isend", "irecv")
# The workbook's ready-made all-reduces (notebook 02): refused while recording.
_WORKBOOK_COLLECTIVES = ("ring_all_reduce", "ps_all_reduce", "builtin_all_reduce")


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

    def __init__(self, traffic: Traffic, allow: set[str], exercise: str):
        super().__init__()
        self.traffic, self.allow, self.exercise = traffic, allow, exercise
        self.api = threading.local()  # the Python function being called (isend, recv, ...)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        namespace, name = func.namespace, func._schema.name.split("::")[-1]
        if namespace in _C10D_NAMESPACES:
            if name in _P2P:
                self._log(name, args)
            else:
                friendly = _FRIENDLY.get(name, name)
                if friendly not in self.allow:
                    raise CollectiveRefused(
                        _refusal(self.exercise, friendly, namespace, self.allow)
                    )
                self.traffic.collectives.append(friendly)
                self.traffic.calls.append(Call(friendly, _input_bytes(func, args, kwargs)))
        return func(*args, **kwargs)

    def _log(self, name: str, args) -> None:
        tensors, peer = args[0], (args[2] if name != "recv_any_source_" else -1)
        base = _P2P[name]
        api = getattr(self.api, "name", None)
        op = api if api and api.endswith(base) else base  # isend/irecv when called so
        numel = sum(t.numel() for t in tensors)
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        self.traffic.messages.append(Message(op, int(peer), numel, nbytes))


def _nbytes(obj) -> int:
    if hasattr(obj, "element_size"):
        return obj.numel() * obj.element_size()
    if isinstance(obj, list | tuple):
        return sum(_nbytes(o) for o in obj)
    return 0


def _input_bytes(func, args, kwargs) -> int:
    """Bytes of what this rank contributes to a collective: the schema's argument named
    input/input_tensor(s) when it has one (all-gather, reduce-scatter), else the first
    tensor argument (all-reduce, broadcast: the tensor is both input and output)."""
    names = [a.name for a in func._schema.arguments]
    values = dict(zip(names, args, strict=False)) | kwargs
    for name in ("input", "input_tensor", "input_tensors"):
        if name in values:
            return _nbytes(values[name])
    return next((n for n in (_nbytes(v) for v in values.values()) if n), 0)


def _refusal(exercise: str, name: str, namespace: str, allow: set[str]) -> str:
    allowed = f" (allowed here: {', '.join(sorted(allow))})" if allow else ""
    return (
        f"{exercise} must not call the collective {name!r} ({namespace}.{name}){allowed}. "
        "Every path to it is watched: torch.distributed, distributed_c10d, object "
        "collectives, ProcessGroup methods. Write it with point-to-point messages: "
        "tdist.send / tdist.recv / tdist.isend / tdist.irecv."
    )


@contextlib.contextmanager
def _named_p2p(watch: _Watch) -> Iterator[None]:
    """Wrap torch.distributed's send/recv/isend/irecv so the log says which one was called."""
    modules = (tdist, tdist.distributed_c10d)
    saved = [(m, n, getattr(m, n)) for m in modules for n in _P2P_FUNCTIONS if hasattr(m, n)]

    def named(name, original):
        def call(*args, **kwargs):
            outer = getattr(watch.api, "name", None)
            watch.api.name = outer or name  # the learner's call, not torch's inner ones
            try:
                return original(*args, **kwargs)
            finally:
                watch.api.name = outer

        call.__wrapped__ = original
        return call

    try:
        for module, name, original in saved:
            setattr(module, name, named(name, original))
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


@contextlib.contextmanager
def _refuse_workbook_collectives(exercise: str) -> Iterator[None]:
    """Make helpers.parallel.collectives' all-reduces raise, however they were imported."""
    from helpers.parallel import collectives

    saved = []
    for name in _WORKBOOK_COLLECTIVES:
        fn = getattr(collectives, name)
        message = (
            f"{exercise} must be your own code: helpers.parallel.collectives.{name} "
            "(notebook 02's ready-made version) is switched off while it is tested."
        )
        # A code object of its own (no closure, builtins only), so it can replace the
        # original's: every reference to the function object now raises.
        scope: dict = {}
        exec(f"def {name}(*args, **kwargs):\n    raise RuntimeError({message!r})\n", scope)
        saved.append((fn, fn.__code__, fn.__defaults__, fn.__kwdefaults__))
        fn.__code__ = scope[name].__code__
    try:
        yield
    finally:
        for fn, code, defaults, kwdefaults in saved:
            fn.__code__, fn.__defaults__, fn.__kwdefaults__ = code, defaults, kwdefaults


@contextlib.contextmanager
def record_traffic(allow: Iterable[str] = (), exercise: str = "this exercise") -> Iterator[Traffic]:
    """Record this rank's p2p messages; refuse every collective not named in ``allow``.

    allow: friendly collective names that may run and are counted in
        ``traffic.collectives`` (e.g. ``("all_reduce",)``).
    exercise: how refusal messages name the code under test.
    Raises RuntimeError at exit if the recording was switched off from inside.
    """
    traffic = Traffic()
    watch = _Watch(traffic, set(allow), exercise)
    with _refuse_workbook_collectives(exercise), _named_p2p(watch):
        with watch:
            yield traffic
            if _get_current_dispatch_mode() is not watch:
                raise RuntimeError(
                    f"{exercise} switched off the traffic recorder (a dispatch mode was "
                    "pushed or popped): leave torch's dispatch modes alone"
                )


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
            "receive while that neighbour is itself stuck sending. Post the send with "
            "tdist.isend, then recv, then wait on the send (or let even ranks send first "
            "and odd ranks receive first)."
        ) from None
