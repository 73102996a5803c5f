"""A rank's end of the relay: one socket to the grading process, and the thread that reads it.

Requests go out from the calling thread (one ``sendmsg`` under a lock, no thread hop);
replies come back on one reader thread, which runs the request's completion (wake the
waiting ``Work``). A reply is read straight into the request's output tensors when they
are contiguous host tensors of its size (no copy of it exists in the rank, so the memory
the grading process measures is the tensors'); otherwise into a buffer the completion
copies from. A send needs no reply: it is deposited at the switch the moment it is
written. If the grading process closes the relay, every request still waiting fails with
that reason.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from collections.abc import Callable

import torch

from helpers.course.grading.relay.frames import HEAD, send_frame

__all__ = ["Channel", "RelayError"]

Reply = Callable[[dict, bytearray | None], None]  # payload None: read into the sink already


def _exactly(sock: socket.socket, n: int) -> bytearray | None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            return None
        got += k
    return buf


def _into(sock: socket.socket, view: memoryview) -> bool:
    got = 0
    while got < len(view):
        k = sock.recv_into(view[got:])
        if k == 0:
            return False
        got += k
    return True


def _sink_views(sink) -> list[memoryview] | None:
    """Byte views of a request's output tensors, when the reply can land in them directly."""
    if not sink or not all(t.device.type == "cpu" and t.is_contiguous() for t in sink):
        return None
    return [memoryview(t.detach().view(-1).view(torch.uint8).numpy()) for t in sink if t.numel()]


class RelayError(RuntimeError):
    """The grading process answered an operation with an error (its message says why)."""


class Channel:
    """The rank's connection to the switch: requests, replies, process groups, markers."""

    def __init__(self, sock: socket.socket, rank: int, world_size: int):
        sock.setblocking(True)
        self.sock, self.rank, self.world_size = sock, rank, world_size
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[Reply, list | None]] = {}
        self._groups: dict[tuple[str, tuple[int, ...]], int] = {}
        self.closed: str | None = None  # why the relay ended, once it has
        self._ended: str | None = None  # the switch's reason, when it ends the relay itself
        self.api = threading.local()  # record_traffic's named_p2p: isend or send
        self._reader = threading.Thread(target=self._read, name="relay-reader", daemon=True)
        self._reader.start()

    # -- out
    def post(self, header: dict, buffers=()) -> None:
        """Send a frame that needs no answer."""
        with self._lock:
            if self.closed:
                raise RelayError(self.closed)
            self._send(header, buffers)

    def request(self, header: dict, buffers, on_reply: Reply, sink=None) -> int:
        """Send a frame; ``on_reply(header, payload)`` runs on the reader thread when the
        answer comes (``header["err"]`` set when the switch refused or failed it; payload
        None when it was read into ``sink``, the output tensors). Returns its id."""
        with self._lock:
            if self.closed:
                raise RelayError(self.closed)
            ident = next(self._ids)
            self._waiting[ident] = (on_reply, sink)
            self._send({**header, "id": ident}, buffers)
            return ident

    def call(self, header: dict, buffers=()) -> tuple[dict, bytearray]:
        """A request answered before it returns; raises RelayError on an error answer."""
        done = threading.Event()
        box: list = []

        def reply(head, payload):
            box.append((head, payload))
            done.set()

        self.request(header, buffers, reply)
        done.wait()
        head, payload = box[0]
        if "err" in head:
            raise RelayError(head["err"])
        return head, payload

    def group(self, name: str, ranks: list[int]) -> int:
        """The index the switch knows a process group by (told once, on first use)."""
        key = (name, tuple(ranks))
        with self._lock:
            if key not in self._groups:
                self._groups[key] = len(self._groups)
                self._send(
                    {"t": "group", "g": self._groups[key], "name": name, "ranks": list(ranks)}
                )
            return self._groups[key]

    def _send(self, header: dict, buffers=()) -> None:
        """send_frame; if the switch hung up on this rank, raise with the reason it sent."""
        try:
            send_frame(self.sock, header, buffers)
        except (BrokenPipeError, ConnectionResetError) as e:
            deadline = time.monotonic() + 2.0  # its end frame may still be on its way to the reader
            while self._ended is None and self._reader.is_alive() and time.monotonic() < deadline:
                time.sleep(0.01)
            raise RelayError(
                self._ended or f"the relay to the grading process failed: {e}"
            ) from None

    # -- in
    def _frame(self) -> bool:
        """Read one reply and complete its request; False at the end of the stream."""
        raw = _exactly(self.sock, HEAD.size)
        if raw is None:
            return False
        hlen, plen = HEAD.unpack(raw)
        text = _exactly(self.sock, hlen)
        if text is None:
            return False
        head = json.loads(text)
        if "end" in head and "id" not in head:  # the switch ends this rank's relay: why
            self._ended = str(head["end"])
            return _exactly(self.sock, plen) is not None if plen else True
        with self._lock:
            on_reply, sink = self._waiting.pop(head.get("id"), (None, None))
        views = None if "err" in head else _sink_views(sink)
        if views is not None and sum(len(v) for v in views) == plen:
            if not all(_into(self.sock, v) for v in views):
                return False
            payload = None
        else:
            payload = _exactly(self.sock, plen) if plen else bytearray()
            if payload is None:
                return False
        if on_reply is not None:
            on_reply(head, payload)
        return True

    def _read(self) -> None:
        reason = "the grading process closed the relay"
        try:
            while self._frame():
                pass
        except OSError as e:
            reason = f"the relay to the grading process failed: {e}"
        reason = self._ended or reason
        with self._lock:
            self.closed = reason
            waiting, self._waiting = self._waiting, {}
        for on_reply, _ in waiting.values():
            on_reply({"err": reason}, bytearray())
