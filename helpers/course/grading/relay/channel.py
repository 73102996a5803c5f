"""A rank's end of the relay: one socket to the grading process, and the thread that reads it.

Requests go out from the calling thread (one ``sendmsg`` under a lock, no thread hop);
replies come back on one reader thread, which runs the request's completion (copy the
reply into the output tensors, wake the waiting ``Work``). A send needs no reply: it is
deposited at the switch the moment it is written. If the grading process closes the
relay, every request still waiting fails with that reason.
"""

from __future__ import annotations

import itertools
import socket
import threading
from collections.abc import Callable

from helpers.course.grading.relay.frames import recv_frame, send_frame

__all__ = ["Channel", "RelayError"]

Reply = Callable[[dict, bytearray], None]


class RelayError(RuntimeError):
    """The grading process answered an operation with an error (its message says why)."""


class Channel:
    """The rank's connection to the switch: requests, replies, process groups, markers."""

    def __init__(self, sock: socket.socket, rank: int, world_size: int):
        sock.setblocking(True)
        self.sock, self.rank, self.world_size = sock, rank, world_size
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._waiting: dict[int, Reply] = {}
        self._groups: dict[tuple[str, tuple[int, ...]], int] = {}
        self.closed: str | None = None  # why the relay ended, once it has
        self.api = threading.local()  # record_traffic's named_p2p: isend or send
        self._reader = threading.Thread(target=self._read, name="relay-reader", daemon=True)
        self._reader.start()

    # -- out
    def post(self, header: dict, buffers=()) -> None:
        """Send a frame that needs no answer."""
        with self._lock:
            if self.closed:
                raise RelayError(self.closed)
            send_frame(self.sock, header, buffers)

    def request(self, header: dict, buffers, on_reply: Reply) -> None:
        """Send a frame; ``on_reply(header, payload)`` runs on the reader thread when the
        answer comes (``header["err"]`` set when the switch refused or failed it)."""
        with self._lock:
            if self.closed:
                raise RelayError(self.closed)
            ident = next(self._ids)
            self._waiting[ident] = on_reply
            send_frame(self.sock, {**header, "id": ident}, buffers)

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
                send_frame(self.sock, {"t": "group", "g": self._groups[key], "name": name,
                                       "ranks": list(ranks)})  # fmt: skip
            return self._groups[key]

    # -- in
    def _read(self) -> None:
        reason = "the grading process closed the relay"
        try:
            while (frame := recv_frame(self.sock)) is not None:
                head, payload = frame
                with self._lock:
                    on_reply = self._waiting.pop(head.get("id"), None)
                if on_reply is not None:
                    on_reply(head, payload)
                # Let go of the answer now: a finished operation's tensors must not stay
                # alive until the next frame (the recorder counts what is kept).
                del frame, head, payload, on_reply
        except OSError as e:
            reason = f"the relay to the grading process failed: {e}"
        with self._lock:
            self.closed = reason
            waiting, self._waiting = self._waiting, {}
        for on_reply in waiting.values():
            on_reply({"err": reason}, bytearray())
