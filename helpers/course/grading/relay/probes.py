"""What the switch measures and withholds for a test: memory samples, lab 6's gates and holds.

``Probes`` serves one job's switch (helpers.course.grading.relay.switch):

* memory (the plan's ``memory``): each rank's process is sampled from /proc as the job
  starts, as each of its recordings opens and closes, and at each ``mark`` it asks for,
  while it waits for the answer (helpers.course.grading.recorder.os_memory). ``pid_of(rank)``
  names the rank's process (the sandbox pool knows it; a rank cannot say it);
* gates (the plan's ``gates``, lab 6): a rank's ``gate`` request is answered with the
  factor the EventLog draws for it, and logged in the order of the rank's operations. Gate
  "begin" and "end" bracket a backward pass; in between, the reply to each all-reduce the
  rank starts is held back until the rank has sent its next all-reduce or gate. A DDP that
  overlaps never waits for a reply during backward and never notices; one whose hook waits
  for its all-reduce never sends the next, and is failed at once when its ``wait`` says
  what it waits for (``waiting``), or, however it waits (asleep, spinning, polling with a
  give-up), once its process has burnt ``stall.CPU_S`` of CPU or slept ``stall.ASLEEP_S``
  with the reply held and nothing sent (``tick``, measured from /proc by stall.py). While a
  reply is held the switch ticks every ``TICK_S`` (``timeout``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from helpers.course.grading.recorder import os_memory
from helpers.course.grading.recorder.event_server import sample_into
from helpers.course.grading.relay.stall import Stall

__all__ = ["HELD", "TICK_S", "Probes"]

TICK_S = 0.01  # how often the switch measures a rank while it holds one of its replies
GIVE_UP_S = 60.0  # a held reply no rank moved past in this long fails whatever the rank does
HELD = (
    "rank {rank} waited for its all-reduce of {numel} elements while its backward was still "
    "running ({why}): the grading process answers an all-reduce started during backward only "
    "once the rank has started its next one (or backward has moved on), as a DDP that overlaps "
    "does (a hook that waits for it, even with a time limit, never overlaps on a cluster). "
    "Start it with async_op=True from the hook, keep the work, and wait for it in finish()."
)


@dataclass
class _Held:
    ident: int
    payload: object
    numel: int
    stall: Stall
    since: float = field(default_factory=time.monotonic)


@dataclass
class _State:
    in_backward: bool = False
    spent: tuple[float, float] = (0.0, 0.0)  # CPU s, asleep s with replies held, this backward
    progress: int = 0  # all-reduces and gates arrived
    sent_at: dict[int, tuple[int, bool]] = field(default_factory=dict)  # id -> (progress, hold?)
    held: list[_Held] = field(default_factory=list)
    files: int = 0  # the most the rank's tmpfs held at its operations since its last sample


class Probes:
    """One job's memory samples, gates and holds (see the module docstring)."""

    def __init__(self, plan, log, world: int, reply: Callable, pid_of: Callable | None = None):
        self.plan, self.log, self.reply = plan, log, reply
        self.pid_of = pid_of or (lambda rank: None)
        self.states = [_State() for _ in range(world)]
        self.stalls: list[tuple[float, float]] = []  # (CPU s, asleep s) of each reply released

    # -- memory
    def start(self, rank: int) -> None:
        """The job's first sample of ``rank``: what its process starts from, the memory of the
        slot it is forked from (the sandbox pool's ``pid_of.slot``), without a reset; or, with
        no slot (plain processes), the rank's own."""
        if not self.plan.memory or self.log is None:
            return
        slot = getattr(self.pid_of, "slot", None)
        if slot is None:
            sample_into(self.log, rank, self._pid(rank), "job start", [])
            return
        try:
            pid = slot(rank)
        except Exception:  # noqa: BLE001 - the sample then says the slot is unknown
            pid = None
        sample_into(self.log, rank, pid, "job start", [], reset=False)

    def sample(self, rank: int, marks, name: str) -> None:
        if self.plan.memory and self.log is not None:
            recs = [o.record for o in marks.stack if o.record is not None]
            mark = sample_into(self.log, rank, self._pid(rank), name, recs)
            if "files" in mark:  # with files that came and went since the last sample
                mark["files_peak"] = max(mark["files"], self.states[rank].files)
            self.states[rank].files = 0

    def touched(self, rank: int) -> None:
        """An operation of ``rank`` arrived (a memory plan): what its sandbox's tmpfs hold now
        counts towards the next sample, so files written and removed between two samples
        while the rank communicates are seen."""
        if not self.plan.memory:
            return
        pid = self._pid(rank)
        if pid is not None:
            state = self.states[rank]
            state.files = max(state.files, os_memory.tmpfs_bytes(pid))

    def _pid(self, rank: int) -> int | None:
        try:
            return self.pid_of(rank)
        except Exception:  # noqa: BLE001 - the sample then says the rank is unknown
            return None

    # -- gates
    def gate(self, rank: int, marks, head: dict) -> torch.Tensor:
        """The factor of the rank's gate (ones when the plan has no gates), logged."""
        name, numel = str(head.get("name", ""))[:200], head.get("n")
        dtype = head.get("dtype")
        if not isinstance(numel, int) or not 0 <= numel <= 1 << 20:
            raise ValueError("a gate names the size of its factor (at most 2**20 numbers)")
        kind = getattr(torch, str(dtype), None)
        if not isinstance(kind, torch.dtype) or not kind.is_floating_point:
            raise ValueError(f"a gate's factor is a floating-point tensor, not {dtype!r}")
        if not self.plan.gates or self.log is None:  # the gate only marks where backward was
            marks.note({"kind": "gate", "name": name, "index": -1})
            return torch.ones(numel, dtype=kind)
        index, factor = self.log.gate(rank, name, numel, kind)
        marks.note({"kind": "gate", "name": name, "index": index})
        state = self.states[rank]
        if name == "begin":
            state.in_backward, state.spent = True, (0.0, 0.0)
        elif name == "end":
            state.in_backward = False
        self._moved(rank)
        return factor

    # -- holds
    def arrived(self, rank: int, op: str, ident) -> None:
        """An operation of ``rank`` arrived: an all-reduce moves it on (releases what it held)."""
        if not self.plan.gates or op != "all_reduce":
            return
        state = self.states[rank]
        self._moved(rank)
        if isinstance(ident, int):
            state.sent_at[ident] = (state.progress, state.in_backward)

    def held_bytes(self) -> int:
        """Bytes of the replies held back now (the switch's cap on a job counts them)."""
        return sum(
            h.payload.numel() * h.payload.element_size()
            if isinstance(h.payload, torch.Tensor)
            else len(h.payload)
            for state in self.states
            for h in state.held
        )

    def answer(self, rank: int, op: str, ident, payload, numel: int) -> None:
        """Reply now, or hold the reply (an all-reduce started during backward, before the
        rank moved on)."""
        state = self.states[rank]
        at, hold = state.sent_at.pop(ident, (None, False)) if self.plan.gates else (None, False)
        if hold and op == "all_reduce" and at == state.progress:
            state.held.append(_Held(ident, payload, numel, Stall(self._pid(rank), state.spent)))
            return
        self.reply(rank, ident, payload)

    def _moved(self, rank: int) -> None:
        state = self.states[rank]
        state.progress += 1
        held, state.held = state.held, []
        for h in held:  # measured once more: a wait the ticks missed (a starved switch) shows
            if h.stall.tick():
                self._fail(rank, h, h.stall.why())
            else:
                self.stalls.append((h.stall.cpu, h.stall.asleep))
                state.spent = h.stall.total()
                self.reply(rank, h.ident, h.payload)

    def waiting(self, rank: int, ident) -> None:
        """The rank's ``wait`` blocks on ``ident``: a held reply then fails with why."""
        state = self.states[rank]
        for h in list(state.held):
            if h.ident == ident:
                self._fail(rank, h, "it said it waits for it")

    def _fail(self, rank: int, h: _Held, why: str) -> None:
        if h in self.states[rank].held:
            self.states[rank].held.remove(h)
        self.reply(rank, h.ident, None, err=HELD.format(rank=rank, numel=h.numel, why=why))

    def timeout(self, idle: float) -> float:
        """How long the switch may wait for a message before it ticks again."""
        return TICK_S if any(s.held for s in self.states) else idle

    def tick(self) -> None:
        """Fail held replies whose rank waits for them (or that waited past GIVE_UP_S)."""
        now = time.monotonic()
        for rank, state in enumerate(self.states):
            for h in list(state.held):
                if h.stall.tick() or now - h.since >= GIVE_UP_S:
                    self._fail(rank, h, h.stall.why())
