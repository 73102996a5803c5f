"""What a ring attention's messages must carry (lab 7's "by hand" checks), and a tamper test.

On each rank, ``watch_ring`` runs the learner's ring under ``record_traffic``: every message
passes through the grading process, whose log (an ``EventLog`` opened with the test's plan:
no collective, contents kept, and the messages it changes on their way) is what the checks
read; the rank keeps its own copy of what it sent only for demonstrations. While it runs, the
workbook's own context-parallel code (helpers.parallel.context.online_softmax,
context_layout, ring_attention, fused_ring_attention, allgather_attention) is switched off
in a learner's own kernel; in the grader's sandbox those modules are not there at all (lab 7's
grading.toml). torch's fused attention is not refused: ``F.scaled_dot_product_attention``
returns no log-sum-exp, which the lab's merge needs, and the tests check values only.

On the grader's side (plain functions of the logs, so another recorder can feed them):

    streamed_rings(events, world)   each rank's ring as the grading process logged it;
        fails when a rank's recordings are not one closed recording
    message_problems(log, rank, world, k, v, positions)   [] when rank sent exactly the
        N - 1 K/V blocks of ranks r, r-1, ..., r-N+2, in that order, only to r + 1,
        and received only from r - 1
    tampered_reference(q, k, v, positions, causal, rank, tamper_rank, delta)  what rank's
        output must be when every message tamper_rank sends has delta added to it

On a GPU every tensor an operation meets must be on the GPU: a log-sum-exp or a mask left
on the host crashes there ("Expected all tensors to be on the same device") and passes on
CPU ranks. ``standin_gpu()`` makes the ranks spawned inside it run on the stand-in GPU in
strict mode (helpers.standin), where it fails the same way, and ``ring_on_gpu`` is the rank's
side: its shares moved to ``d.device``, the learner's ring run there, the output brought back.

A block passes through ranks j, j+1, ..., i-1 on its way from its owner j to rank i, each
sending it once, so rank i sees block j tampered exactly when tamper_rank is among them.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as tdist
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import standin
from helpers.course.grading.recorder.events import EventLog
from helpers.course.grading.recorder.traffic import Tamper, Traffic, record_traffic

try:
    from helpers.parallel.context import (
        allgather_attention,
        context_layout,
        fused_ring_attention,
        online_softmax,
        ring_attention,
    )
    from helpers.parallel.context.online_softmax import attention, causal_mask
except ImportError:  # a lab 7 rank: its sandbox has none of them, nothing to switch off
    allgather_attention = context_layout = fused_ring_attention = None
    online_softmax = ring_attention = attention = causal_mask = None

__all__ = [
    "RingLog",
    "message_problems",
    "no_workbook_answers",
    "own_attention",
    "ring_on_gpu",
    "standin_gpu",
    "streamed_rings",
    "tampered_reference",
    "watch_ring",
]

_ANSWER_MODULES = tuple(
    m
    for m in (
        online_softmax,
        context_layout,
        ring_attention,
        fused_ring_attention,
        allgather_attention,
    )
    if m is not None
)


@dataclass
class RingLog:
    """One rank's ring: its traffic (peers, sizes) and a copy of every message it sent."""

    traffic: Traffic
    sent: list[torch.Tensor] = field(default_factory=list)

    def summary(self) -> dict:
        """Picklable: messages as (op, peer, numel) and the sent contents (CPU copies)."""
        return {"messages": [(m.op, m.peer, m.numel) for m in self.traffic.messages],
                "sent": [t.detach().cpu().clone() for t in self.sent]}  # fmt: skip


class _Courier(TorchDispatchMode):
    """Keeps this rank's own copy of every tensor a c10d send carries (before any tamper)."""

    def __init__(self, log: RingLog):
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        if func.namespace == "c10d" and name == "send":
            self.log.sent.extend(t.detach().clone() for t in args[0])
        return func(*args, **(kwargs or {}))


@functools.cache
def _off_code(message: str):
    """The code of a function that raises RuntimeError(message) (compiled once per message:
    the hidden tests switch the answers off around every call)."""
    scope: dict = {}
    exec(f"def _off(*args, **kwargs):\n    raise RuntimeError({message!r})\n", scope)
    return scope["_off"].__code__


def _switch_off(fn, where: str, exercise: str):
    """Replace fn's code by one that raises; return what restores it."""
    message = (f"{exercise} must be your own code: {where} (the workbook's version, notebook 09) "
               "is switched off while it is tested")  # fmt: skip
    saved = (fn.__code__, fn.__defaults__, fn.__kwdefaults__)
    fn.__code__ = _off_code(message)

    def restore():
        fn.__code__, fn.__defaults__, fn.__kwdefaults__ = saved

    return restore


@contextlib.contextmanager
def no_workbook_answers(exercise: str = "this exercise") -> Iterator[None]:
    """Switch off every function and autograd method of the context-parallel modules."""
    restores = []
    try:
        for module in _ANSWER_MODULES:
            for name, obj in vars(module).items():
                if getattr(obj, "__module__", None) != module.__name__ or name.startswith("__"):
                    continue
                where = f"{module.__name__}.{name}"
                if inspect.isfunction(obj):
                    restores.append(_switch_off(obj, where, exercise))
                elif inspect.isclass(obj):
                    for meth in ("forward", "backward", "__init__"):
                        fn = inspect.getattr_static(obj, meth, None)
                        fn = getattr(fn, "__func__", fn)
                        if inspect.isfunction(fn):
                            restores.append(_switch_off(fn, f"{where}.{meth}", exercise))
        yield
    finally:
        for restore in reversed(restores):
            restore()


@contextlib.contextmanager
def own_attention(exercise: str = "this exercise") -> Iterator[None]:
    """The workbook's context-parallel code switched off (in a learner's own kernel: the
    grader's sandbox has none of it)."""
    with no_workbook_answers(exercise):
        yield


@contextlib.contextmanager
def watch_ring(
    exercise: str = "ring_attention", tamper: Tamper | Callable | None = None
) -> Iterator[RingLog]:
    """Record this rank's ring (see module docstring): collectives refused, messages logged
    (what the test's plan keeps and changes: helpers.course.grading.recorder.plan), the
    workbook's answers switched off. The yielded RingLog is the rank's own copy (for
    demonstrations). ``tamper``: in a learner's own kernel only, a change for this rank's
    sends (under the grader's relay a rank's own tamper is ignored)."""
    rank = tdist.get_rank() if tdist.is_initialized() else 0
    change = tamper
    if tamper is not None and not isinstance(tamper, Tamper):
        change = Tamper(rank, ("send", "isend"), tamper, nth=None)
    with record_traffic(exercise=exercise, content=True, tamper=change) as traffic:  # noqa: SIM117
        with own_attention(exercise):
            log = RingLog(traffic)
            with _Courier(log):
                yield log


def streamed_rings(events: EventLog, world: int) -> list[dict]:
    """Per rank, its ring (one ``watch_ring``) as the grading process logged it, in the form of
    ``RingLog.summary()``, plus "tampered" (messages changed on their way). Fails when a
    rank's recordings are not one closed recording with nothing outside it."""
    out = []
    for (rec,) in events.complete(world, 1, "ring"):
        out.append({
            "messages": [(e["op"], e["peer"], e["numel"]) for e in rec.messages],
            "sent": rec.contents("p2p", outgoing=True),
            "tampered": len(rec.tampered),
        })  # fmt: skip
    return out


def _blocks(k, v, positions, rank, world) -> list[torch.Tensor]:
    """The K/V blocks rank must send, in order: those of ranks r, r-1, ..., r-N+2."""
    owners = [(rank - s) % world for s in range(world - 1)]
    return [torch.cat([t.index_select(-2, positions[j]).flatten() for t in (k, v)])
            for j in owners]  # fmt: skip


def message_problems(log: dict, rank: int, world: int, k, v, positions) -> list[str]:
    """Why rank's messages are not a ring attention's ([] when they are).

    log: ``RingLog.summary()`` of this rank. k, v: the whole sequence's keys and values.
    The K/V of one step may go as one message or several, in any layout (stacked,
    concatenated, K after V): each step's values must be exactly that block's, in order.
    """
    right, left = (rank + 1) % world, (rank - 1) % world
    problems = []
    peers_out = sorted(
        {p for op, p, _ in log["messages"] if op in ("send", "isend") and p != right}
    )
    peers_in = sorted({p for op, p, _ in log["messages"] if op in ("recv", "irecv") and p != left})
    if peers_out:
        problems.append(f"rank {rank} sent to rank(s) {peers_out}: in a ring it sends only to "
                        f"its right-hand neighbour (rank + 1) % N = {right}")  # fmt: skip
    if peers_in:
        problems.append(f"rank {rank} received from rank(s) {peers_in}: in a ring it receives "
                        f"only from its left-hand neighbour (rank - 1) % N = {left}")  # fmt: skip
    want = _blocks(k, v, positions, rank, world)
    stream = (
        torch.cat([t.flatten().double() for t in log["sent"]]) if log["sent"] else torch.zeros(0)
    )
    total = sum(b.numel() for b in want)
    if stream.numel() != total:
        problems.append(
            f"rank {rank} sent {stream.numel()} numbers; a ring on {world} ranks sends the K/V "
            f"blocks of ranks {[(rank - s) % world for s in range(world - 1)]} "
            f"(N - 1 = {world - 1} steps), {total} numbers in all"
        )
        return problems
    start = 0
    for step, block in enumerate(want):
        piece = stream[start : start + block.numel()]
        start += block.numel()
        if not torch.equal(piece.sort().values, block.double().sort().values):
            owner = (rank - step) % world
            problems.append(
                f"rank {rank}, step {step}: the message does not carry the keys and values of "
                f"rank {owner} (at step s, rank r passes on the block of rank (r - s) % N: "
                "its own first, then the one it just received)"
            )
    return problems


def tampered_reference(q, k, v, positions, causal, rank, tamper_rank, delta) -> torch.Tensor:
    """rank's output when every message tamper_rank sends arrives with ``delta`` added."""
    world = len(positions)
    k2, v2 = k.clone(), v.clone()
    for j in range(world):  # block j reaches rank after passing j, j+1, ..., rank-1
        if tamper_rank != rank and (tamper_rank - j) % world < (rank - j) % world:
            k2.index_add_(
                -2, positions[j], torch.full_like(k2.index_select(-2, positions[j]), delta)
            )
            v2.index_add_(
                -2, positions[j], torch.full_like(v2.index_select(-2, positions[j]), delta)
            )
    q_pos = positions[rank]
    mask = causal_mask(q_pos, torch.arange(k.shape[-2])) if causal else None
    return attention(q.index_select(-2, q_pos), k2, v2, mask)


@contextlib.contextmanager
def standin_gpu() -> Iterator[None]:
    """Ranks spawned inside run on the stand-in GPU, strict: a host tensor met by a device
    tensor fails as on CUDA (helpers.standin; the ranks read the mode when they start)."""
    saved = os.environ.get(standin.MODE_ENV)
    os.environ[standin.MODE_ENV] = "strict"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(standin.MODE_ENV, None)
        else:
            os.environ[standin.MODE_ENV] = saved


def ring_on_gpu(d, ring, q, k, v, positions, causal, exercise: str = "ring_attention"):
    """On a rank: ``ring`` on this rank's rows moved to ``d.device``, with the workbook's
    answers and torch's fused attention off; (device name, output on the host)."""
    warnings.filterwarnings("ignore", message=".*barrier.*")  # the stand-in's cleanup, not yours
    mine = [t.index_select(-2, positions[d.rank]).to(d.device) for t in (q, k, v)]
    with own_attention(exercise):
        out = ring(d, *mine, positions, causal)
    if not isinstance(out, torch.Tensor) or out.device != d.device:
        where = out.device if isinstance(out, torch.Tensor) else type(out).__name__
        raise AssertionError(f"{exercise} returned its output on {where}: q is on {d.device}, "
                             "and so should the output be")  # fmt: skip
    return str(d.device), out.cpu()
