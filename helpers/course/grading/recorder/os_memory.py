"""A rank's memory as the operating system accounts it, read from outside the rank's process.

The grading process reads ``/proc/<pid>/status`` of a rank (any user may) and resets the
rank's high-water mark by writing ``5`` to ``/proc/<pid>/clear_refs`` (the rank's owner or
root may; the rank's own sandbox mounts /proc read-only, so the rank cannot reset it
itself)::

    first = sample(pid)        # resident bytes now; the high-water mark reset to them
    ...                        # the rank works
    later = sample(pid)        # later["hwm"]: the most bytes resident at once since `first`

Each sample holds, in bytes: ``rss`` (resident: anonymous + file + shared memory), ``anon``,
``file`` (pages of mapped files: code, mostly), ``shmem`` (shared memory, tmpfs mappings),
``hwm`` (the peak of ``rss`` since the previous reset), ``files`` (what the rank's sandbox
holds in its tmpfs: /tmp, /dev/shm and its scratch directory, when the grading process can
see them) and ``threads``. What a rank keeps is ``anon + shmem + files``; the most it held at
once above a sample is ``hwm - rss`` of that sample (conservatively: code pages the rank
mapped in between count too, which is why the tests warm up first).

Precision: torch's CPU tensors come from glibc's malloc; above its mmap threshold a block is
mapped on its own and given back on free, below it the heap keeps freed memory. glibc raises
the threshold (up to 32 MiB) each time a large block is freed, so in a process that freed
big tensors before, tensors of several MiB come from the heap and stay resident after they
are freed. ``prepare_allocator`` fixes the threshold at 64 KiB in the rank (mallopt turns the
adjustment off), so every tensor of 64 KiB or more is resident exactly while it lives: the
tests size their tensors in MiB, where a page's rounding does not show.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

__all__ = [
    "MeterError",
    "blocked",
    "let_threads_settle",
    "measurable",
    "prepare_allocator",
    "sample",
    "tmpfs_bytes",
    "trim",
]

SANDBOX_TMPFS = ("tmp", "dev/shm", "scratch")
_FIELDS = {"VmRSS": "rss", "VmHWM": "hwm", "RssAnon": "anon", "RssFile": "file",
           "RssShmem": "shmem", "Threads": "threads"}  # fmt: skip
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
PR_SET_DUMPABLE = 4
MMAP_THRESHOLD = 64 << 10


class MeterError(RuntimeError):
    """The rank's memory could not be read or reset (it ended, or its /proc entry is closed)."""


def _status(pid: int) -> dict[str, int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError as e:
        raise MeterError(f"process {pid} cannot be measured: {e.strerror}") from None
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in _FIELDS:
            parts = value.split()
            out[_FIELDS[key]] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
    if "rss" not in out:
        raise MeterError(f"process {pid} has no memory left to measure (it is ending)")
    return out


def tmpfs_bytes(pid: int) -> int:
    """Bytes in the tmpfs of the rank's sandbox (/tmp, /dev/shm, its scratch directory), as its
    mount namespace shows them; 0 for a process that shares the grading process's mounts (a
    plain process: the machine's /tmp and /dev/shm are not the rank's alone)."""
    try:
        if os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt"):
            return 0
        with open(f"/proc/{pid}/mountinfo") as f:
            kinds = {}
            for line in f:
                fields, _, fs = line.partition(" - ")
                kinds[fields.split()[4]] = fs.split()[0]
    except OSError:
        return 0
    total = 0
    for path in SANDBOX_TMPFS:
        if kinds.get("/" + path) != "tmpfs":
            continue
        try:
            st = os.statvfs(f"/proc/{pid}/root/{path}")
        except OSError:
            continue
        total += (st.f_blocks - st.f_bfree) * st.f_frsize
    return total


def sample(pid: int, reset: bool = True, files: bool = True) -> dict[str, int]:
    """The rank's memory now (see the module docstring); then its high-water mark reset."""
    out = _status(pid)
    out.setdefault("anon", out["rss"])
    out.setdefault("file", 0)
    out.setdefault("shmem", 0)
    out["files"] = tmpfs_bytes(pid) if files else 0
    if reset:
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError as e:
            raise MeterError(
                f"the peak memory of process {pid} cannot be reset ({e.strerror}): the grader "
                "needs to own the rank's /proc entries (a rank that made itself non-dumpable "
                "cannot be measured)"
            ) from None
    return out


def let_threads_settle(timeout: float = 0.5) -> None:
    """In a rank, before a sample: wait (at most ``timeout`` s) until no other thread of this
    process is running or runnable. gloo's worker thread lets go of a collective's tensors a
    moment after the collective returned, and on a busy machine it may wait for a core to do
    so: sampled then, the rank looks as if it kept the buffer (a learner's kernel, where the
    ranks talk gloo; under the relay there is no such thread)."""
    me, deadline = str(threading.get_native_id()), time.monotonic() + timeout
    while time.monotonic() < deadline and _busy("self", skip=me):
        time.sleep(0.002)


def blocked(pid: int) -> bool:
    """Is every thread of ``pid`` asleep (none running or runnable)? A rank that waits for a
    reply the relay holds back looks like this; a rank that computes does not."""
    return _busy(pid) is False


def _busy(pid: int | str, skip: str = "") -> bool | None:
    """Whether a thread of ``pid`` (but ``skip``) is running or runnable; None if unreadable."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if tid != skip and state in ("R", "D"):
            return True
    return False


def trim() -> None:
    """In a rank, before a sample: give back to the system the free memory glibc's heap keeps
    resident (malloc_trim), so that what the code measured next allocates is counted as it
    touches it, not reused unseen from memory freed before the sample (the unpickled
    arguments of a job, mostly). A rank that skips it only hides memory freed before the
    sample, which the sample before counted (the tests check every stretch between samples)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def measurable() -> None:
    """In a rank: let the grading process, run by the same user, reset this process's peak
    memory (its /proc entries owned by that user: PR_SET_DUMPABLE). A sandbox slot is not
    dumpable, and a rank forked from it inherits that: for a grader that is not root its
    /proc/<pid>/clear_refs would be root's. The rank's own /proc is read-only (the sandbox's
    jail), so the rank still cannot reset it itself; one that makes itself non-dumpable again
    is not measured, and its memory tests fail saying so."""
    try:
        ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def prepare_allocator() -> None:
    """In a rank: glibc's mmap threshold fixed at 64 KiB (see the module docstring)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to fix
        return
    libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    libc.mallopt(M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD)
