"""The EventLog's socket for ranks without the relay (a learner's own kernel on gloo).

One thread accepts the ranks' connections (helpers.course.grading.recorder.events.EventSender)
and reads their events as they come: a connection with a label is one recording, one
without is the rank's probe (marks and gates outside a recording). Requests are answered
on the same connection: a memory sample taken here from /proc (helpers.course.grading.
recorder.os_memory) while the rank waits, lab 6's gate factors. Tensors arrive as raw bytes
of a named dtype; nothing is unpickled.
"""

from __future__ import annotations

import json
import selectors
import socket
import struct
import threading
import time

import torch

from helpers.course.grading.recorder import os_memory

__all__ = ["Server", "sample_into"]

_HEAD = struct.Struct("!II")


def sample_into(log, rank: int, pid: int | None, name: str, recordings, reset=True) -> dict:
    """Sample ``pid``'s memory as mark ``name``, into the log and each of ``recordings``."""
    try:
        if pid is None:
            raise os_memory.MeterError(f"rank {rank}'s process is not known to the grader")
        mark = {"kind": "mark", "name": name, **os_memory.sample(pid, reset, files=reset)}
    except os_memory.MeterError as e:
        mark = {"kind": "mark", "name": name, "error": str(e)}
    log.add_mark(rank, mark)
    for rec in recordings:
        rec.events.append(mark)
    return mark


class _Conn:
    def __init__(self) -> None:
        self.buf = bytearray()
        self.rec = None  # its Recording, once opened with a label
        self.rank = -1
        self.pid: int | None = None
        self.probe = False


class Server:
    """Accept and read the ranks' connections for ``log`` until ``close``."""

    def __init__(self, log, address: str):
        self.log, self.plan = log, log.plan
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(address)
        self._listener.listen(128)
        self._conns: dict[socket.socket, _Conn] = {}
        self._open: dict[int, list] = {}  # rank -> its recordings open now
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="event-log", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        while True:
            ready = sel.select(0.05)
            for key, _ in ready:
                if key.fileobj is self._listener:
                    conn, _ = self._listener.accept()
                    self._conns[conn] = _Conn()
                    sel.register(conn, selectors.EVENT_READ)
                else:
                    self._read(key.fileobj, sel)
            if self._stop.is_set() and not ready and not self._conns:
                break
        sel.close()

    def _read(self, sock: socket.socket, sel) -> None:
        data = sock.recv(1 << 20)
        state = self._conns[sock]
        if not data:
            sel.unregister(sock)
            sock.close()
            del self._conns[sock]
            return
        state.buf += data
        buf = state.buf
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
            reply, payload = self._event(state, event)
            if event.get("reply"):
                head = json.dumps(reply).encode()
                sock.sendall(_HEAD.pack(len(head), len(payload)) + head + payload)

    def _event(self, state: _Conn, event: dict) -> tuple[dict, bytes]:
        kind = event.get("kind")
        opened = self._open.setdefault(state.rank, [])
        if kind == "open":
            state.rank, state.pid = int(event.get("rank", -1)), event.get("pid")
            if event.get("label") is None:
                state.probe = True
                return {}, b""
            state.rec = self.log.begin(state.rank, str(event["label"]), int(event.get("seq", 0)))
            self._open.setdefault(state.rank, []).append(state.rec)
            if self.plan.memory:
                self._sample(state, "open", [state.rec])
            return {}, b""
        if kind == "mark":
            self._sample(state, str(event.get("name", "")), opened)
            return {}, b""
        if kind == "gate":
            dtype = getattr(torch, str(event.get("dtype", "float64")))
            if self.plan.gates:
                index, factor = self.log.gate(
                    state.rank, str(event["name"]), int(event["numel"]), dtype
                )
            else:  # no factors: the gate only marks where the rank's backward was
                index, factor = -1, torch.ones(int(event["numel"]), dtype=dtype)
            gate = {"kind": "gate", "name": str(event["name"]), "index": index}
            for rec in opened:
                rec.events.append(gate)
            raw = factor.contiguous().view(torch.uint8).numpy().tobytes()
            return {"index": index}, raw
        if state.rec is None:
            return {}, b""
        if kind == "close":
            if self.plan.memory:
                self._sample(state, "close", [state.rec])
            state.rec.closed = True
            if state.rec in opened:
                opened.remove(state.rec)
        else:
            state.rec.events.append(event)
        return {}, b""

    def _sample(self, state: _Conn, name: str, recordings) -> None:
        sample_into(self.log, state.rank, state.pid, name, recordings)

    def close(self, timeout: float = 10.0) -> None:
        """Read what is still on its way (the ranks have exited), then stop listening."""
        time.sleep(0)  # let the thread see connections the ranks made just before exiting
        self._stop.set()
        self._thread.join(timeout)
        self._listener.close()
