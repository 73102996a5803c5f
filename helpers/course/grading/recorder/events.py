"""The recorder's events, streamed from the ranks to the grading process as they happen.

A rank's recorder (helpers.course.grading.recorder.traffic) lives in the same process as the
learner's code, so its lists could be changed after the fact. While an
``EventLog`` is open in the grading process (the notebook's kernel), every
recorder of every rank sends each event down a socket to it the moment it
happens: a message, a collective, a refused call, a tampered message, an
allocation. What the kernel received cannot be taken back; the tests grade the
kernel's copy::

    with EventLog() as log:               # the kernel: listens, one thread reads
        out = spawn(fn, world_size=4)     # ranks: record_traffic(...) streams to it
    log.recordings(rank=1)                # [Recording, ...] in the order rank 1 made them

Events travel as JSON headers plus raw tensor bytes: nothing a rank sends is
unpickled here. The ranks find the log through the ``WB_EVENT_LOG`` environment
variable, which ``spawn`` passes on; a recorder without it streams nothing, and a
test that expects events then reports a recorder that was switched off.
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import struct
import tempfile
import threading
import time
from dataclasses import dataclass, field

import torch

__all__ = ["ENV", "EventLog", "EventSender", "Recording", "active_log", "relay_markers", "route"]

ENV = "WB_EVENT_LOG"
_HEAD = struct.Struct("!II")  # header length, payload length


def _tensor_bytes(t: torch.Tensor) -> tuple[dict, bytes]:
    t = t.detach().to("cpu").contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}, raw


class EventSender:
    """Rank side: one connection per recording; ``send`` writes one event at once."""

    def __init__(self, address: str, label: str, seq: int):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(address)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else -1
        self.send({"kind": "open", "rank": rank, "label": label, "seq": seq, "pid": os.getpid()})

    def send(self, event: dict, content: torch.Tensor | None = None) -> None:
        meta, raw = ({}, b"") if content is None else _tensor_bytes(content)
        head = json.dumps({**event, **({"content": meta} if meta else {})}).encode()
        self.sock.sendall(_HEAD.pack(len(head), len(raw)) + head + raw)

    def close(self) -> None:
        try:
            self.send({"kind": "close"})
        finally:
            self.sock.close()


def sender(label: str) -> EventSender | None:
    """A sender to the open EventLog of the grading process, or None when there is none."""
    relayed = relay_markers(label, False, None, None, threading.local())
    if relayed is not None:  # a sandboxed rank: its stream goes through the grader's relay
        return relayed
    address = os.environ.get(ENV)
    if not address:
        return None
    _SEQ[0] += 1
    return EventSender(address, label, _SEQ[0])


_SEQ = [0]  # recordings opened by this process, in order
_ACTIVE: list[EventLog] = []  # the EventLogs open (entered) in this process, innermost last


_ROUTE: list = []  # where a rank's markers go when its process group is the relay


def active_log() -> EventLog | None:
    """The EventLog open in this process (the relay's switch logs into it), or None."""
    return _ACTIVE[-1] if _ACTIVE else None


def route(open_markers) -> None:
    """Send this rank's recording markers to ``open_markers(label, content, allow, tamper,
    api)`` (helpers.course.grading.relay.backend.connect calls this; it returns a sender,
    or None when the relay is not this rank's process group)."""
    _ROUTE[:] = [open_markers]


def relay_markers(label: str, content: bool, allow, tamper, api):
    """A sender of markers on the relay, or None when the rank's group is not the relay."""
    return _ROUTE[0](label, content, allow, tamper, api) if _ROUTE else None


@dataclass
class Recording:
    """Everything one recorder of one rank streamed, as the grading process received it."""

    rank: int
    label: str
    seq: int
    events: list[dict] = field(default_factory=list)
    closed: bool = False  # the recorder's context ended normally

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["kind"] == kind]

    @property
    def messages(self) -> list[dict]:
        """Point-to-point operations: op (send/isend/recv/irecv), peer, numel, bytes."""
        return self.of("p2p")

    @property
    def calls(self) -> list[tuple[str, int]]:
        """(collective, bytes this rank put in) of each allowed collective, in order."""
        return [(e["name"], e["bytes"]) for e in self.of("collective") if e["allowed"]]

    @property
    def refused(self) -> list[str]:
        return [e["name"] for e in self.of("collective") if not e["allowed"]]

    @property
    def tampered(self) -> list[dict]:
        return self.of("tampered")

    @property
    def peak_bytes(self) -> int:
        """Most bytes of tensors made inside the recording that were alive at once."""
        return max((e["live"] for e in self.of("alloc")), default=0)

    @property
    def kept_bytes(self) -> int:
        """Bytes of tensors made inside the recording that were still alive at its end."""
        return sum(e["bytes"] for e in self.of("kept"))

    def contents(self, kind: str = "p2p", outgoing: bool = True) -> list[torch.Tensor]:
        """The tensors that events of ``kind`` carried (sends only, by default, for p2p)."""
        picked = self.of(kind)
        if kind == "p2p":
            picked = [e for e in picked if e["op"] in ("send", "isend")] if outgoing else picked
        return [e["tensor"] for e in picked if "tensor" in e]


class EventLog:
    """Grading-process side: a socket the ranks stream to, and one thread that reads it."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="wb-events-")
        self.address = os.path.join(self._dir, "s")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.address)
        self._listener.listen(128)
        self._recordings: list[Recording] = []
        self._open: dict[socket.socket, tuple[bytearray, Recording | None]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="event-log", daemon=True)
        self._thread.start()
        self._saved_env: str | None = None

    # -- the reading thread
    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        while True:
            ready = sel.select(0.05)
            for key, _ in ready:
                if key.fileobj is self._listener:
                    conn, _ = self._listener.accept()
                    self._open[conn] = (bytearray(), None)
                    sel.register(conn, selectors.EVENT_READ)
                else:
                    self._read(key.fileobj, sel)
            if self._stop.is_set() and not ready and not self._open:
                break
        sel.close()

    def _read(self, conn: socket.socket, sel) -> None:
        data = conn.recv(1 << 20)
        buf, rec = self._open[conn]
        if not data:
            sel.unregister(conn)
            conn.close()
            del self._open[conn]
            return
        buf += data
        while len(buf) >= _HEAD.size:
            hlen, plen = _HEAD.unpack_from(buf)
            end = _HEAD.size + hlen + plen
            if len(buf) < end:
                break
            event = json.loads(bytes(buf[_HEAD.size : _HEAD.size + hlen]))
            if "content" in event:
                meta = event.pop("content")
                raw = bytearray(buf[_HEAD.size + hlen : end])
                dtype = getattr(torch, meta["dtype"])
                flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
                event["tensor"] = flat.reshape(meta["shape"])
            del buf[:end]
            rec = self._event(rec, event)
        self._open[conn] = (buf, rec)

    def begin(self, rank: int, label: str, seq: int) -> Recording:
        """A new recording of ``rank`` (the relay's switch opens them for the ranks)."""
        rec = Recording(rank, label, seq)
        self._recordings.append(rec)
        return rec

    def _event(self, rec: Recording | None, event: dict) -> Recording | None:
        if event["kind"] == "open" and rec is None:
            rec = self.begin(event["rank"], event["label"], event["seq"])
        elif rec is not None and event["kind"] == "close":
            rec.closed = True
        elif rec is not None:
            rec.events.append(event)
        return rec

    # -- the grading side
    def __enter__(self) -> EventLog:
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
        if self._stop.is_set():
            return
        time.sleep(0)  # let the thread see connections the ranks made just before exiting
        self._stop.set()
        self._thread.join(timeout)
        self._listener.close()
        try:
            os.unlink(self.address)
            os.rmdir(self._dir)
        except OSError:
            pass

    def recordings(self, rank: int | None = None) -> list[Recording]:
        """The recordings received (of one rank), in the order each rank made them."""
        recs = [r for r in self._recordings if rank is None or r.rank == rank]
        return sorted(recs, key=lambda r: (r.rank, r.seq))
