"""The relay process group, grading side: every rank's collectives and messages pass here.

``RelaySwitch(socks)`` serves one socket per rank (index = global rank) on one thread.
It never runs or unpickles what a rank sends: frames are a JSON header and raw bytes
(relay/frames.py). For each process group it matches the n-th collective of every rank,
checks that they agree (relay/ops.py says which rank called what when they do not),
computes the result on its own copies and answers each rank; it delivers point-to-point
messages (a send is kept until the matching receive is posted). Along the way it applies
the plan of the ``EventLog`` open in this process as the switch starts (the test's:
helpers.course.grading.recorder.plan) and logs into it, per rank (relay/marks.py): each
collective and message, in the recording open on that rank or outside every one, with its
contents when the plan keeps them; it refuses the collectives the plan does not allow and
applies its tampers; it samples the ranks' memory and serves lab 6's gates and holds
(relay/probes.py). Nothing a rank says about itself is logged: it can only mark where its
recordings start and end, ask for a memory sample or a gate.

One switch serves one job: give it fresh socket pairs, run the ranks, then ``close()``
(which waits for every rank to hang up, so nothing a rank sent is left unread).
``seen(rank)`` lists every operation a rank made, inside a recording or not.
"""

from __future__ import annotations

import math
import os
import selectors
import socket
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field

import torch

from helpers.course.grading.recorder import events
from helpers.course.grading.relay.frames import (
    MAX_MESSAGE,
    FrameReader,
    MessageTooLarge,
    as_bytes,
    dtype_of,
    send_frame,
)
from helpers.course.grading.relay.marks import Marks
from helpers.course.grading.relay.ops import Mismatch, Part, answer, parse_part
from helpers.course.grading.relay.probes import Probes

__all__ = ["HELD_MESSAGES", "RelaySwitch"]

# What one job may leave in the grading process at once, in messages of the largest size: a
# ring's or a batch's sends posted before their receives fit; six 200 MiB isends nobody
# received took the grading process to 8.16 GB before this cap (docs/instructors.md).
HELD_MESSAGES = 4


@dataclass
class _Group:
    name: str
    ranks: tuple[int, ...]
    next: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # rank -> n-th call
    slots: dict[int, _Slot] = field(default_factory=dict)


@dataclass
class _Slot:
    parts: dict[int, Part] = field(default_factory=dict)  # group rank -> its call
    ids: dict[int, int] = field(default_factory=dict)  # group rank -> request id
    arrived: set[int] = field(default_factory=set)
    failed: str | None = None


@dataclass
class _Rank:
    sock: socket.socket
    reader: FrameReader
    marks: Marks
    groups: dict[int, _Group] = field(default_factory=dict)
    alive: bool = True


class RelaySwitch:
    """Serve the ranks' sockets (one per global rank) until ``close()``."""

    def __init__(
        self,
        socks: list[socket.socket],
        reply_timeout: float = 60.0,
        max_message: int = MAX_MESSAGE,
        pid_of=None,
        max_held: int | None = None,
    ):
        """``pid_of(rank)``: the rank's process id as this process sees it (the sandbox pool
        knows it), for the memory samples of a plan that asks for them. ``max_held``: the
        most bytes the switch holds for the job at once (sends not yet received, collectives
        waiting for their group, replies held back), ``HELD_MESSAGES`` messages by default."""
        self.world = len(socks)
        self.max_held = HELD_MESSAGES * max_message if max_held is None else max_held
        self.held = 0  # bytes of unreceived sends and of collectives waiting for their group
        self.log = events.active_log()
        plan = self.log.plan if self.log is not None else Marks(0).plan
        self.ranks = []
        for r, sock in enumerate(socks):
            sock.settimeout(reply_timeout)  # replies block at most this long on a stalled rank
            marks = Marks(r, self.log, plan)
            self.ranks.append(_Rank(sock, FrameReader(sock, max_message), marks))
        self.probes = Probes(plan, self.log, self.world, self._reply, pid_of)
        for r in range(self.world):
            self.probes.start(r)
        self.errors: list[str] = []  # frames the switch could not make sense of
        self._groups: dict[tuple[str, tuple[int, ...]], _Group] = {}
        self._mail: dict[tuple, deque] = defaultdict(deque)  # (group, dst, tag) -> sends
        self._posted: dict[tuple, deque] = defaultdict(deque)  # (group, dst, tag) -> recvs
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        for r, state in enumerate(self.ranks):
            self._sel.register(state.sock, selectors.EVENT_READ, r)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="relay-switch", daemon=True)
        self._thread.start()

    # -- the serving thread
    def _serve(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._sel.select(self.probes.timeout(0.25)):
                if key.data is None:
                    os.read(self._wake_r, 64)
                    continue
                self._read(key.data)
            self.probes.tick()

    def _read(self, rank: int) -> None:
        state = self.ranks[rank]
        try:
            frames = state.reader.feed()
        except MessageTooLarge as e:  # refused unread: the rank's operation fails with why
            self.errors.append(f"rank {rank}: {e}")
            if isinstance(e.header.get("id"), int):
                self._reply(rank, e.header["id"], err=f"relay: {e}")
            else:  # a send, which gets no answer: its peers learn why from the hang-up
                self._hang_up(rank, f"rank {rank}: {e}")
            return
        except (OSError, ValueError) as e:
            self._hang_up(rank, f"rank {rank} sent what is not a relay frame ({e})")
            return
        for head, payload in frames:
            try:
                self._handle(rank, head, payload)
            except Exception as e:  # noqa: BLE001 - the rank gets the reason, the switch goes on
                self.errors.append(f"rank {rank}: {e}")
                if isinstance(head.get("id"), int):
                    self._reply(rank, head["id"], err=f"relay: {e}")
        if state.reader.closed:
            self._hang_up(rank, f"rank {rank} closed its relay (its process ended)")

    def _handle(self, rank: int, head: dict, payload: bytearray) -> None:
        kind, marks = head.get("t"), self.ranks[rank].marks
        if kind in ("coll", "send", "recv"):
            self.probes.touched(rank)
        if kind == "coll":
            self._collective(rank, head, payload)
        elif kind == "send":
            self._send(rank, head, payload)
        elif kind == "recv":
            self._recv(rank, head)
        elif kind == "group":
            self._group(rank, head)
        elif kind == "open":
            marks.open(head)
            self.probes.sample(rank, marks, "open")
            self._reply(rank, head.get("id"))
        elif kind == "close":
            self.probes.sample(rank, marks, "close")
            marks.close()
            self._reply(rank, head.get("id"))
        elif kind == "mark":
            self.probes.sample(rank, marks, str(head.get("name", ""))[:200])
            self._reply(rank, head.get("id"))
        elif kind == "gate":
            self._reply(rank, head.get("id"), self.probes.gate(rank, marks, head))
        elif kind == "waiting":
            self.probes.waiting(rank, head.get("id"))
        elif kind == "sync":
            self._reply(rank, head.get("id"))
        else:
            raise ValueError(f"unknown frame {kind!r}")

    def _reply(self, rank: int, ident, payload: torch.Tensor | bytearray | None = None, **head):
        """Answer request ``ident`` of ``rank`` (with ``err=`` when it failed)."""
        state = self.ranks[rank]
        if not isinstance(ident, int) or not state.alive:
            return
        body = (
            []
            if payload is None
            else [payload if isinstance(payload, bytearray) else as_bytes(payload)]
        )
        try:
            send_frame(state.sock, {"id": ident, **head}, body)
        except OSError as e:
            self._hang_up(rank, f"rank {rank} stopped reading its relay ({e})")

    # -- process groups and collectives
    def _group(self, rank: int, head: dict) -> None:
        ranks, name, index = head.get("ranks"), head.get("name"), head.get("g")
        if (not isinstance(ranks, list) or not isinstance(name, str) or not isinstance(index, int)
                or sorted(set(ranks)) != sorted(ranks) or rank not in ranks
                or not all(isinstance(r, int) and 0 <= r < self.world for r in ranks)):  # fmt: skip
            raise ValueError(f"a process group of ranks {ranks!r} is not one rank {rank} is in")
        key = (name, tuple(ranks))
        group = self._groups.setdefault(key, _Group(name, tuple(ranks)))
        self.ranks[rank].groups[index] = group

    def _group_of(self, rank: int, head: dict) -> _Group:
        group = self.ranks[rank].groups.get(head.get("g"))
        if group is None:
            raise ValueError(f"rank {rank} used a process group it never announced")
        return group

    def _collective(self, rank: int, head: dict, payload: bytearray) -> None:
        group = self._group_of(rank, head)
        part = parse_part(rank, head, payload)
        marks, g = self.ranks[rank].marks, group.ranks.index(rank)
        n = group.next[rank]
        group.next[rank] += 1
        slot = group.slots.setdefault(n, _Slot())
        slot.arrived.add(g)
        slot.ids[g] = head.get("id")
        self.probes.arrived(rank, part.op, slot.ids[g])
        part.inputs = marks.tamper(part.op, part.inputs, part.shapes)
        message = marks.refused(part.op)
        nbytes = sum(t.numel() * t.element_size() for t in part.inputs)
        event = {"kind": "collective", "name": part.op, "op": part.op, "bytes": nbytes,
                 "numel": sum(t.numel() for t in part.inputs), "allowed": message is None,
                 "group": list(group.ranks)}  # fmt: skip
        shown = part.inputs[0].view(part.shapes[0]) if len(part.inputs) == 1 else None
        marks.log_op(event, shown if message is None else None)
        if message is not None:
            self._reply(rank, slot.ids[g], err=message, refused=True)
            self._fail(group, n, slot, f"rank {rank}'s {part.op} was refused: {message}")
        elif slot.failed is not None:
            self._reply(rank, slot.ids[g], err=slot.failed)
        elif (dead := self._gone(group, slot)) is not None:  # rank 0 too
            self._fail(group, n, slot, f"rank {dead} ended before it called {part.op}")
            self._reply(rank, slot.ids[g], err=slot.failed)
        elif not self._hold(rank, nbytes):
            self._fail(group, n, slot, self.errors[-1])
        else:
            slot.parts[g] = part
            part.held = nbytes
        if len(slot.arrived) == len(group.ranks):
            del group.slots[n]
            if slot.failed is None:
                self._complete(group, slot)

    def _gone(self, group: _Group, slot: _Slot) -> int | None:
        """A rank of the group that ended before it joined this collective."""
        for i, r in enumerate(group.ranks):
            if i not in slot.arrived and not self.ranks[r].alive:
                return r
        return None

    def _fail(self, group: _Group, n: int, slot: _Slot, why: str) -> None:
        if slot.failed is None:
            slot.failed = why
        self._release(slot.parts.values())
        for g in list(slot.parts):
            self._reply(group.ranks[g], slot.ids[g], err=f"relay: {slot.failed}")
        slot.parts.clear()

    def _complete(self, group: _Group, slot: _Slot) -> None:
        parts = [slot.parts[g] for g in range(len(group.ranks))]
        self._release(parts)
        try:
            outs = answer(parts[0].op, parts)
        except (Mismatch, RuntimeError) as e:
            for g, r in enumerate(group.ranks):
                self._reply(r, slot.ids[g], err=f"relay: {e}")
            return
        for g, r in enumerate(group.ranks):
            self.probes.answer(r, parts[g].op, slot.ids[g], outs[g], outs[g].numel())

    # -- point to point
    def _p2p(
        self, rank: int, head: dict, base: str
    ) -> tuple[_Group, int, int, torch.dtype, list, str]:
        group = self._group_of(rank, head)
        peer, tag = head.get("peer"), head.get("tag")
        if (
            not isinstance(tag, int)
            or not isinstance(peer, int)
            or not -1 <= peer < len(group.ranks)
        ):
            raise ValueError(f"{base}: peer {peer!r} is not a rank of the group")
        if peer == -1 and base == "send":
            raise ValueError("send needs a destination")
        shapes = head.get("s")
        if not isinstance(shapes, list) or not all(isinstance(s, list) for s in shapes):
            raise ValueError(f"{base}: s must list the tensor shapes")
        api = head.get("api")
        op = api if api in (base, "i" + base) else base
        other = -1 if peer == -1 else group.ranks[peer]
        return group, other, tag, dtype_of(head.get("dtype")), shapes, op

    def _send(self, rank: int, head: dict, payload: bytearray) -> None:
        group, dst, tag, dtype, shapes, op = self._p2p(rank, head, "send")
        marks = self.ranks[rank].marks
        numels = [math.prod(s) for s in shapes]
        flat = torch.frombuffer(payload, dtype=dtype) if payload else torch.empty(0, dtype=dtype)
        if flat.numel() != sum(numels):
            raise ValueError(f"send: {len(payload)} bytes do not hold tensors of shapes {shapes}")
        pieces = marks.tamper(op, list(flat.split(numels)), shapes)
        if len(pieces) == 1:  # no copy of a lone tensor
            flat = pieces[0].reshape(-1)
        elif pieces:
            flat = torch.cat(pieces)
        event = {"kind": "p2p", "op": op, "peer": dst, "numel": flat.numel(),
                 "bytes": flat.numel() * flat.element_size()}  # fmt: skip
        marks.log_op(event, pieces[0].view(shapes[0]) if len(pieces) == 1 else None)
        key = (id(group), dst, tag)
        posted = self._posted[key]
        for i, (src, ident, nbytes) in enumerate(posted):
            if src in (-1, rank):
                del posted[i]
                self._deliver(dst, ident, rank, flat, nbytes)
                return
        if self._hold(rank, flat.numel() * flat.element_size()):
            self._mail[key].append((rank, flat))

    def _recv(self, rank: int, head: dict) -> None:
        group, src, tag, dtype, shapes, op = self._p2p(rank, head, "recv")
        numel = sum(math.prod(s) for s in shapes)
        nbytes = numel * torch.empty(0, dtype=dtype).element_size()
        event = {"kind": "p2p", "op": op, "peer": src, "numel": numel, "bytes": nbytes}
        self.ranks[rank].marks.log_op(event, None)
        key, ident = (id(group), rank, tag), head.get("id")
        mail = self._mail[key]
        for i, (sender, flat) in enumerate(mail):
            if src in (-1, sender):
                del mail[i]
                self.held -= flat.numel() * flat.element_size()
                self._deliver(rank, ident, sender, flat, nbytes)
                return
        if src != -1 and not self.ranks[src].alive:
            self._reply(rank, ident, err=f"relay: rank {src} ended before it sent this message")
            return
        self._posted[key].append((src, ident, nbytes))

    def _deliver(self, dst: int, ident, src: int, flat: torch.Tensor, nbytes: int) -> None:
        sent = flat.numel() * flat.element_size()
        if sent != nbytes:
            why = (f"relay: rank {src} sent {sent} bytes ({flat.numel()} {str(flat.dtype)[6:]}) "
                   f"to rank {dst}, whose receive buffer holds {nbytes} bytes")  # fmt: skip
            self._reply(dst, ident, err=why)
            return
        self._reply(dst, ident, flat, src=src)

    # -- what the job leaves in this process
    def _hold(self, rank: int, nbytes: int) -> bool:
        """Count ``nbytes`` more held for the job; past ``max_held``, end ``rank``'s relay
        with why (False: the caller keeps nothing)."""
        held = self.held + self.probes.held_bytes() + nbytes
        if held <= self.max_held:
            self.held += nbytes
            return True
        why = (
            f"relay: rank {rank} left {held:,} bytes waiting in the grader (messages sent and "
            f"not yet received, collectives the other ranks have not joined), more than the "
            f"{self.max_held:,} bytes the relay holds for a job: receive each message you send "
            "(and wait for your sends) before sending many more"
        )
        self.errors.append(why)
        state = self.ranks[rank]
        if state.alive:
            try:
                send_frame(state.sock, {"end": why})
            except OSError:
                pass
        self._hang_up(rank, why)
        return False

    def _release(self, parts) -> None:
        for part in parts:
            self.held -= getattr(part, "held", 0)
            part.held = 0

    # -- ranks that end
    def _hang_up(self, rank: int, why: str) -> None:
        state = self.ranks[rank]
        if not state.alive:
            return
        state.alive = False
        self._sel.unregister(state.sock)
        try:
            state.sock.shutdown(socket.SHUT_RDWR)  # the rank's waiting operations fail at once
        except OSError:
            pass
        for group in {id(g): g for g in self._groups.values() if rank in g.ranks}.values():
            for n, slot in list(group.slots.items()):
                if group.ranks.index(rank) not in slot.arrived:
                    self._fail(
                        group,
                        n,
                        slot,
                        f"rank {rank} ended before it joined this collective ({why})",
                    )
        for (_, dst, _), posted in self._posted.items():
            for waiting in [p for p in posted if p[0] == rank]:
                posted.remove(waiting)
                self._reply(
                    dst, waiting[1], err=f"relay: rank {rank} ended before it sent this message"
                )

    # -- the grading side
    def seen(self, rank: int) -> list[dict]:
        """Every collective and message of ``rank`` (without contents), recorded or not."""
        return list(self.ranks[rank].marks.history)

    def close(self, timeout: float = 5.0) -> None:
        """Wait (up to ``timeout`` s) for every rank to hang up, then stop serving."""
        deadline = time.monotonic() + timeout
        while any(s.alive for s in self.ranks) and time.monotonic() < deadline:
            time.sleep(0.005)
        self._stop.set()
        os.write(self._wake_w, b"x")
        self._thread.join(timeout)
        for state in self.ranks:
            state.sock.close()
        self._sel.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def __enter__(self) -> RelaySwitch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
