"""The control messages between the spawn pool and its zygote: a length, then a pickle.

Kept apart from helpers.launch.zygote so that the pool (and the package) never
import the zygote's module: ``python -m helpers.launch.zygote`` then runs it once,
as ``__main__``.
"""

from __future__ import annotations

import os
import pickle
import struct

__all__ = ["HELLO", "recv", "send"]

_FRAME = struct.Struct("!I")  # 4-byte length before every control message
HELLO = 8  # a worker's first bytes on a socket: kind ("o", "e", "r") + rank, 7 digits


def send(fd: int, obj) -> None:
    data = pickle.dumps(obj)
    view = memoryview(_FRAME.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def recv(fd: int):
    head = _read_exact(fd, _FRAME.size)
    if head is None:
        return None
    return pickle.loads(_read_exact(fd, _FRAME.unpack(head)[0]) or b"")
