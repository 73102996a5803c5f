"""Frames between the grader and a sandbox slot: a JSON header and raw bytes, never a pickle.

    frame = header length (4 bytes) + blob length (4 bytes) + JSON header + blob

The grader reads what a sandbox sends with ``read`` and a size limit, so a learner who
writes into the stream (a slot's process is the learner's, in the end) can make the
grader refuse the frame, never run code. What the grader sends into a sandbox may be a
pickle inside the blob: that direction is trusted.

``Reader`` buffers a non-blocking socket for the grader's event loop; ``send`` and
``recv_blocking`` serve the slot, which reads its control socket in order.
"""

from __future__ import annotations

import json
import socket
import struct

__all__ = ["FrameError", "MAX_BLOB", "MAX_HEADER", "Reader", "encode", "recv_blocking", "send"]

_HEAD = struct.Struct("!II")
MAX_HEADER = 1 << 20  # a header is a small dict: a traceback at most
MAX_BLOB = (1 << 32) - 1  # a value the ranks return (the pool caps it lower)


class FrameError(RuntimeError):
    """A frame the reader refuses (too large, not JSON, not a dict)."""


def encode(header: dict, blob: bytes = b"") -> bytes:
    head = json.dumps(header).encode()
    return _HEAD.pack(len(head), len(blob)) + head + blob


def send(sock: socket.socket, header: dict, blob: bytes = b"") -> None:
    sock.sendall(encode(header, blob))


def _decode(head: bytes) -> dict:
    try:
        header = json.loads(head.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise FrameError(f"a frame's header is not JSON: {e}") from None
    if not isinstance(header, dict) or not isinstance(header.get("kind"), str):
        raise FrameError("a frame's header is not a dict with a 'kind'")
    return header


def _exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def recv_blocking(sock: socket.socket) -> tuple[dict, bytes] | None:
    """The next frame from ``sock``, or None at end of stream."""
    head = _exact(sock, _HEAD.size)
    if head is None:
        return None
    n_head, n_blob = _HEAD.unpack(head)
    header, blob = _exact(sock, n_head), _exact(sock, n_blob) if n_blob else b""
    if header is None or blob is None:
        return None
    return _decode(header), blob


class Reader:
    """Frames from a non-blocking socket, as they complete (grader side)."""

    def __init__(self, max_blob: int = MAX_BLOB):
        self.buf = bytearray()
        self.max_blob = max_blob

    def feed(self, data: bytes) -> list[tuple[dict, bytes]]:
        self.buf += data
        out = []
        while len(self.buf) >= _HEAD.size:
            n_head, n_blob = _HEAD.unpack_from(self.buf)
            if n_head > MAX_HEADER or n_blob > self.max_blob:
                raise FrameError(
                    f"the sandbox sent a frame of {n_head + n_blob:,} bytes, over the limit"
                )
            end = _HEAD.size + n_head + n_blob
            if len(self.buf) < end:
                break
            header = _decode(bytes(self.buf[_HEAD.size : _HEAD.size + n_head]))
            out.append((header, bytes(self.buf[_HEAD.size + n_head : end])))
            del self.buf[:end]
        return out
