"""The relay's wire format: a small JSON header and the raw bytes of the tensors it names.

One frame is ``!II`` (header length, payload length), the header as UTF-8 JSON (a dict),
then the payload: tensors' bytes, back to back, in the order the header lists them. The
grading process never unpickles what a rank sends (a rank runs the learner's code): it
reads JSON and bytes, and makes tensors only of the dtypes named in ``DTYPES``.
"""

from __future__ import annotations

import json
import socket
import struct

import torch

__all__ = [
    "DTYPES",
    "MAX_MESSAGE",
    "FrameReader",
    "MessageTooLarge",
    "as_bytes",
    "dtype_of",
    "recv_frame",
    "send_frame",
]

HEAD = struct.Struct("!II")  # header length, payload length
MAX_HEADER = 1 << 20  # a header is a few hundred bytes; more is not a relay frame
MAX_PAYLOAD = 1 << 31
MAX_MESSAGE = 256 << 20  # what a rank may send at once: the labs' memory tests send 8 MiB blocks
DTYPES = {
    name: getattr(torch, name)
    for name in (
        "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
        "uint8", "int8", "int16", "int32", "int64", "bool",
    )
}  # fmt: skip


def dtype_of(name: object) -> torch.dtype:
    """The torch dtype a header names (only the ones the relay carries)."""
    if not isinstance(name, str) or name not in DTYPES:
        raise ValueError(f"the relay carries tensors of {', '.join(DTYPES)}, not {name!r}")
    return DTYPES[name]


def as_bytes(t: torch.Tensor) -> memoryview:
    """A tensor's bytes without a copy when it is contiguous on the CPU."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.view(torch.uint8).numpy()).cast("B")


def send_frame(sock: socket.socket, header: dict, buffers=()) -> None:
    """Write one frame (header, then each buffer) with as few system calls as it takes."""
    head = json.dumps(header, separators=(",", ":")).encode()
    parts = [memoryview(b) for b in buffers if len(b)]
    size = sum(p.nbytes for p in parts)
    parts.insert(0, memoryview(HEAD.pack(len(head), size) + head))
    while parts:
        sent = sock.sendmsg(parts[:512])
        while parts and sent >= parts[0].nbytes:
            sent -= parts[0].nbytes
            parts.pop(0)
        if sent:
            parts[0] = parts[0][sent:]


def _recv_exactly(sock: socket.socket, n: int) -> bytearray | None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            return None
        got += k
    return buf


def recv_frame(sock: socket.socket) -> tuple[dict, bytearray] | None:
    """Read one whole frame (blocking); None at the end of the stream."""
    head = _recv_exactly(sock, HEAD.size)
    if head is None:
        return None
    hlen, plen = HEAD.unpack(head)
    header = _recv_exactly(sock, hlen)
    payload = _recv_exactly(sock, plen) if plen else bytearray()
    if header is None or payload is None:
        return None
    return json.loads(header), payload


class MessageTooLarge(ValueError):
    """A rank announced a message larger than the relay carries: nothing was allocated for
    it, its bytes are read and dropped, and the rank is answered with this message."""

    def __init__(self, header: dict, size: int, cap: int):
        self.header = header
        super().__init__(
            f"a message of {size:,} bytes is more than the {cap:,} bytes the relay carries "
            "at once (the tests never need that much): send smaller tensors"
        )


class FrameReader:
    """Frames from a socket that may deliver them in pieces (the switch's non-blocking side).

    ``feed()`` reads what the socket has and returns the frames completed so far; a frame
    that is not a JSON dict, or is larger than the limits, raises ValueError (a payload
    over ``max_payload``: MessageTooLarge, after which its bytes are skipped).
    """

    CHUNK = 1 << 16

    def __init__(self, sock: socket.socket, max_payload: int = MAX_PAYLOAD):
        self.sock = sock
        self.buf = bytearray()
        self.big: tuple[dict, bytearray, int] | None = None  # a large payload being filled
        self.closed = False
        self.max_payload = min(max_payload, MAX_PAYLOAD)
        self.skip = 0  # bytes of a refused payload still to read and drop

    def _skip(self) -> None:
        data = self.sock.recv(min(self.skip, self.CHUNK))
        if not data:
            self.closed = True
        self.skip -= len(data)

    def feed(self) -> list[tuple[dict, bytearray]]:
        frames: list[tuple[dict, bytearray]] = []
        if self.skip:
            self._skip()
            return frames
        if self.big is not None:
            header, payload, got = self.big
            k = self.sock.recv_into(memoryview(payload)[got:])
            if k == 0:
                self.closed = True
                return frames
            if got + k < len(payload):
                self.big = (header, payload, got + k)
                return frames
            self.big = None
            frames.append((header, payload))
            return frames
        data = self.sock.recv(self.CHUNK)
        if not data:
            self.closed = True
            return frames
        self.buf += data
        while len(self.buf) >= HEAD.size:
            hlen, plen = HEAD.unpack_from(self.buf)
            if hlen > MAX_HEADER or plen > MAX_PAYLOAD:
                raise ValueError(f"a frame of {hlen} + {plen} bytes is not a relay frame")
            if len(self.buf) < HEAD.size + hlen:
                break
            header = json.loads(bytes(self.buf[HEAD.size : HEAD.size + hlen]))
            if not isinstance(header, dict):
                raise ValueError("a relay header is a JSON object")
            if plen > self.max_payload:  # drop it as it comes, never hold it
                if frames:
                    break  # the frames before it first; it is refused on the next read
                have = len(self.buf) - HEAD.size - hlen
                del self.buf[: HEAD.size + hlen + min(have, plen)]
                self.skip = plen - min(have, plen)
                raise MessageTooLarge(header, plen, self.max_payload)
            start, end = HEAD.size + hlen, HEAD.size + hlen + plen
            if len(self.buf) >= end:
                frames.append((header, self.buf[start:end]))
                del self.buf[:end]
                continue
            payload = bytearray(plen)  # the rest goes straight into its own buffer
            have = len(self.buf) - start
            payload[:have] = self.buf[start:]
            self.buf = bytearray()
            self.big = (header, payload, have)
            break
        return frames
