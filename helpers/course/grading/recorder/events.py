"""The grading process's log of what each rank did, and the plan the ranks are held to.

A test opens an ``EventLog`` around the ranks it starts; what it grades is the log's copy,
made in its own process, never the rank's::

    with EventLog(allow=["all_reduce"], content=True, tamper=[...], memory=True) as log:
        out = spawn(fn, world_size=4)     # ranks: record_traffic(...) marks their recordings
    log.recordings(rank=1)                # [Recording, ...] in the order rank 1 made them
    log.outside(rank=1)                   # its operations outside every recording
    log.marks(rank=1)                     # every memory sample taken of it, in order

The keyword arguments are the job's plan (helpers.course.grading.recorder.plan): which
collectives may run, whether contents are kept, which messages change on their way,
whether memory is measured, lab 6's gates. Under the grader's relay
(helpers.course.grading.relay) the switch logs every operation itself and applies the plan;
a rank only says where its recordings start and end, and what it calls them. A rank that
closes a recording early, or never opens one, changes which recording an operation is
listed in, never whether it is refused, recorded, changed or measured.

Without the relay (a learner's own kernel on gloo) each rank's recorder streams its events
here as they happen, down a socket whose address the ranks find in ``WB_EVENT_LOG``
(``spawn`` passes it on), applying the plan the log left next to that socket; memory is
sampled here from /proc when a recording opens and closes and at each mark
(helpers.course.grading.recorder.event_server). Events travel as JSON headers plus raw
tensor bytes: nothing a rank sends is unpickled here.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import tempfile
import threading

import torch

from helpers.course.grading.recorder import plan as plans
from helpers.course.grading.recorder.recording import Recording, held

__all__ = ["ENV", "EventLog", "EventSender", "Recording", "active_log", "relay_markers", "route"]

ENV = "WB_EVENT_LOG"
_HEAD = struct.Struct("!II")  # header length, payload length


def _tensor_bytes(t: torch.Tensor) -> tuple[dict, bytes]:
    t = t.detach().to("cpu").contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}, raw


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the EventLog closed its socket")
        buf += chunk
    return bytes(buf)


class EventSender:
    """Rank side, without the relay: one connection per recording (``label``) or, with
    ``label=None``, the rank's probe connection (marks and gates outside a recording)."""

    def __init__(self, address: str, label: str | None, seq: int, sync: bool = False):
        if not _PREPARED:  # the memory samples count tensors as they live (os_memory)
            from helpers.course.grading.recorder import os_memory

            os_memory.prepare_allocator()
            _PREPARED.append(True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(address)
        self.sync = sync  # the log samples memory as the recording opens and closes: wait for it
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else -1
        opened = {"kind": "open", "rank": rank, "label": label, "seq": seq, "pid": os.getpid()}
        self.request(opened) if sync else self.send(opened)

    def send(self, event: dict, content: torch.Tensor | None = None) -> None:
        meta, raw = ({}, b"") if content is None else _tensor_bytes(content)
        head = json.dumps({**event, **({"content": meta} if meta else {})}).encode()
        self.sock.sendall(_HEAD.pack(len(head), len(raw)) + head + raw)

    def request(self, event: dict) -> tuple[dict, bytes]:
        """Send an event and wait for the log's answer (a mark, a gate, a measured edge)."""
        if event.get("kind") != "gate":
            from helpers.course.grading.recorder import os_memory

            os_memory.let_threads_settle()  # gloo's thread lets go of a collective's buffers
            os_memory.trim()  # the log may sample this rank's memory now
        self.send({**event, "reply": True})
        hlen, plen = _HEAD.unpack(_recv_exactly(self.sock, _HEAD.size))
        head = json.loads(_recv_exactly(self.sock, hlen))
        return head, _recv_exactly(self.sock, plen) if plen else b""

    def close(self) -> None:
        try:
            self.request({"kind": "close"}) if self.sync else self.send({"kind": "close"})
        finally:
            self.sock.close()


_SEQ = [0]  # connections opened by this process, in order
_PREPARED: list = []  # this process's allocator is set for the memory samples
_PROBE: dict[str, EventSender] = {}  # address -> this process's probe connection
_OPEN: list[EventSender] = []  # this process's recordings open now, innermost last
_ACTIVE: list[EventLog] = []  # the EventLogs open (entered) in this process, innermost last
_ROUTE: list = []  # where a rank's markers go when its process group is the relay
_RELAY: list = []  # the relay's mark and gate, when it is connected


def address() -> str | None:
    """The address of the EventLog this (kernel) rank streams to, if any."""
    return os.environ.get(ENV) or None


def planned() -> plans.Plan:
    """The plan of the EventLog this rank streams to (empty without one, or under the relay)."""
    return plans.planned(address())


def sender(label: str, sync: bool = False) -> EventSender | None:
    """A sender to the open EventLog of the grading process, or None when there is none."""
    where = address()
    if not where:
        return None
    _SEQ[0] += 1
    return EventSender(where, label, _SEQ[0], sync)


def opened(out: EventSender | None) -> None:
    """record_traffic's sender is open: marks and gates go through it, in its order."""
    if out is not None:
        _OPEN.append(out)


def closed(out: EventSender | None) -> None:
    if out is not None and out in _OPEN:
        _OPEN.remove(out)


def probe() -> EventSender | None:
    """Where this (kernel) rank's marks and gates go: its innermost open recording's
    connection, so that they are logged in order with its messages, else its probe
    connection, made once per log."""
    where = address()
    if not where:
        return None
    if _OPEN:
        return _OPEN[-1]
    if where not in _PROBE:
        _SEQ[0] += 1
        _PROBE[where] = EventSender(where, None, _SEQ[0])
    return _PROBE[where]


def active_log() -> EventLog | None:
    """The EventLog open in this process (the relay's switch logs into it), or None."""
    return _ACTIVE[-1] if _ACTIVE else None


def route(open_markers, relay=None) -> None:
    """Send this rank's recording markers to ``open_markers(label, allow, api)``, and its
    marks and gates to ``relay`` (an object with ``active()``, ``mark(name)`` and
    ``gate(name, numel, dtype)``): helpers.course.grading.relay.backend.connect calls this.
    ``open_markers`` returns a marker sender, or None when the relay is not this rank's
    process group."""
    _ROUTE[:] = [open_markers]
    _RELAY[:] = [relay] if relay is not None else []


def relay() -> object | None:
    """The relay's probe functions, while the relay is this rank's process group."""
    return _RELAY[0] if _RELAY and _RELAY[0].active() else None


def relay_markers(label: str, allow, api):
    """A sender of markers on the relay, or None when the rank's group is not the relay."""
    return _ROUTE[0](label, allow, api) if _ROUTE else None


class EventLog:
    """Grading-process side: the plan, and everything logged about every rank."""

    def __init__(self, *, allow=None, content=False, tamper=(), memory=False, gates=False):
        self.plan = plans.Plan.make(allow, content, tamper, memory, gates)
        self._recordings: list[Recording] = []
        self._outside: dict[int, list[dict]] = {}
        self._marks: dict[int, list[dict]] = {}
        self._factors: dict[tuple[str, int], torch.Tensor] = {}
        self._gates: dict[tuple[int, str], int] = {}
        self._rng = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        self._lock = threading.Lock()
        self._dir = tempfile.mkdtemp(prefix="wb-events-")
        self.address = os.path.join(self._dir, "s")
        self._server = None
        self._saved_env: str | None = None

    # -- what the relay's switch (or the kernel's server) logs
    def begin(self, rank: int, label: str, seq: int) -> Recording:
        """A new recording of ``rank``."""
        rec = Recording(rank, label, seq)
        with self._lock:
            self._recordings.append(rec)
        return rec

    def outside_event(self, rank: int, event: dict) -> None:
        """An operation of ``rank`` outside every recording."""
        with self._lock:
            self._outside.setdefault(rank, []).append(event)

    def add_mark(self, rank: int, mark: dict) -> dict:
        with self._lock:
            self._marks.setdefault(rank, []).append(mark)
        return mark

    def gate(
        self, rank: int, name: str, numel: int, dtype: torch.dtype
    ) -> tuple[int, torch.Tensor]:
        """Lab 6: the factor rank's ``index``-th gate ``name`` applies (every rank's
        ``index``-th gate of a name gets the same one, drawn here at random), and index."""
        with self._lock:
            index = self._gates.get((rank, name), 0)
            self._gates[rank, name] = index + 1
            key = (name, index)
            if key not in self._factors or self._factors[key].numel() != numel:
                self._factors[key] = 0.5 + torch.rand(
                    numel, generator=self._rng, dtype=torch.float64
                )
            return index, self._factors[key].to(dtype)

    # -- the grading side
    def recordings(self, rank: int | None = None) -> list[Recording]:
        """The recordings (of one rank), in the order each rank made them."""
        recs = [r for r in self._recordings if rank is None or r.rank == rank]
        return sorted(recs, key=lambda r: (r.rank, r.seq))

    def outside(self, rank: int) -> list[dict]:
        """The operations of ``rank`` that ran outside every recording."""
        return list(self._outside.get(rank, []))

    def marks(self, rank: int) -> list[dict]:
        """Every memory sample of ``rank``, in order: the job's start, each recording's
        edges and each mark."""
        return list(self._marks.get(rank, []))

    def grown(self, rank: int, sample: dict) -> int | None:
        """Bytes ``rank`` held more at ``sample`` than its process did as the job started (the
        sandbox slot it was forked from, before any code of the job ran): what it keeps before
        a measured stretch, wherever it was made (at import, in a warm-up, between recordings).
        None without that first sample (a learner's own kernel)."""
        start = [m for m in self.marks(rank) if m.get("name") == "job start"]
        if not start:
            return None
        return held(sample) - held(start[0])

    def factors(self, name: str) -> list[torch.Tensor]:
        """Lab 6: the factors the gate ``name`` applied, by occurrence (step)."""
        found = sorted((i, t) for (n, i), t in self._factors.items() if n == name)
        return [t for _, t in found]

    def complete(self, world: int, per_rank: int, what: str = "runs") -> list[list[Recording]]:
        """Each rank's recordings, asserting that there are ``per_rank`` of them, all closed,
        and that nothing ran outside them."""
        out = []
        for rank in range(world):
            recs = self.recordings(rank)
            assert len(recs) == per_rank and all(r.closed for r in recs), (
                f"rank {rank}: {len(recs)} recordings ({sum(r.closed for r in recs)} closed) for "
                f"{per_rank} {what}: its recorder was switched off or ended early"
            )
            stray = [e.get("name", e.get("op")) for e in self.outside(rank)
                     if e["kind"] != "mark" and e.get("op") != "barrier"]  # fmt: skip
            assert not stray, (f"rank {rank} ran {stray} outside the code under test: every "
                               "operation of the test is recorded, where it runs")  # fmt: skip
            out.append(recs)
        return out

    # -- lifetime
    def __enter__(self) -> EventLog:
        from helpers.course.grading.recorder.event_server import Server

        plans.write(self.plan, self._dir)
        self._server = Server(self, self.address)
        self._saved_env = os.environ.get(ENV)
        os.environ[ENV] = self.address
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        if self._saved_env is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = self._saved_env
        self.close()

    def close(self, timeout: float = 10.0) -> None:
        """Read what is still on its way (the ranks have exited), then stop listening."""
        if self._server is not None:
            self._server.close(timeout)
            self._server = None
        for name in (os.path.basename(self.address), plans.PLAN_FILE):
            try:
                os.unlink(os.path.join(self._dir, name))
            except OSError:
                pass
        try:
            os.rmdir(self._dir)
        except OSError:
            pass
