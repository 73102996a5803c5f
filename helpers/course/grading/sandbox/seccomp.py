"""Inside a sandbox: the system calls a job's process may not make, refused by a seccomp filter.

The grader measures a rank's memory from outside, in what the OS accounts to the rank's
process and its tmpfs (helpers.course.grading.recorder.os_memory). Memory held anywhere
else is invisible to it, so a job's process (a rank, or the learner process of direct
calls) may not put memory there: ``install()``, called by ``jail.enter`` after every
capability is dropped and before any learner code, loads a classic-BPF filter
(prctl PR_SET_NO_NEW_PRIVS, then seccomp SECCOMP_SET_MODE_FILTER, on every thread) that
answers EPERM to

* a new process: fork, vfork, clone without CLONE_THREAD (a thread shares the rank's
  memory and is counted with it; a child process's memory is not), or with a namespace
  flag; clone3 answers ENOSYS, so glibc's pthread_create falls back to clone, which is
  checked (clone3's flags sit in a struct the filter cannot read);
* memory that belongs to no process's RSS or tmpfs: memfd_create, memfd_secret, SysV
  shared memory and message queues (shmget, msgget), POSIX message queues (mq_open),
  io_uring's registered buffers (io_uring_setup), userfaultfd;
* reaching another process's memory: process_vm_readv / process_vm_writev;
* new namespaces (unshare, setns): a user namespace would give back the capability to
  mount a tmpfs the grader does not read;
* on x86-64, any x32 system call, and any call of another architecture (int 0x80).

Threads (torch's intra-op pool, the relay's reader, gloo's) are clones with CLONE_THREAD
and go on working. A refusal reaches Python as PermissionError; ``install`` also replaces
``os.fork`` and the other Python entries to these calls by functions that raise
``SandboxRefusal`` with what to change (the filter, not the Python, is the boundary).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import sys

__all__ = ["REFUSAL", "SandboxRefusal", "install", "supported"]

REFUSAL = (
    "{what}: the grader's ranks may not start processes or hold memory outside the rank "
    "(no fork, subprocess, multiprocessing, memfd, shared memory segment or message queue): "
    "keep your data in the rank's own tensors and do the work in the rank itself"
)

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
NR, ARCH, ARG0 = 0, 4, 16  # arg 0's low 32 bits (both arches are little-endian)
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, PR_SET_NO_NEW_PRIVS = 1, 1, 38
CLONE_THREAD = 0x00010000
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000
CLONE_NAMESPACES |= 0x40000000
X32_BIT = 0x40000000

# Per architecture: its audit arch, the seccomp call's number, clone's, and the refused calls.
ARCHES = {
    "x86_64": {
        "audit": 0xC000003E,
        "seccomp": 317,
        "clone": 56,
        "clone3": 435,
        "numbers": {
            "fork": 57,
            "vfork": 58,
            "memfd_create": 319,
            "memfd_secret": 447,
            "shmget": 29,
            "msgget": 68,
            "mq_open": 240,
            "io_uring_setup": 425,
            "userfaultfd": 323,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "unshare": 272,
            "setns": 308,
        },
    },
    "aarch64": {  # no fork or vfork system call: glibc's fork is clone
        "audit": 0xC00000B7,
        "seccomp": 277,
        "clone": 220,
        "clone3": 435,
        "numbers": {
            "memfd_create": 279,
            "memfd_secret": 447,
            "shmget": 194,
            "msgget": 186,
            "mq_open": 180,
            "io_uring_setup": 425,
            "userfaultfd": 282,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "unshare": 97,
            "setns": 268,
        },
    },
}
MACHINES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


class SandboxRefusal(PermissionError):
    """A job's process asked for what the sandbox refuses (a process, memory outside it)."""


def supported(machine: str | None = None) -> str | None:
    """The filter's architecture for this machine, or None where there is none."""
    return MACHINES.get((machine or platform.machine()).lower())


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(arch: str) -> bytes:
    """The filter for ``arch`` ("x86_64" or "aarch64"), as sock_filter instructions."""
    spec = ARCHES[arch]
    perm, nosys = RET_ERRNO | errno.EPERM, RET_ERRNO | errno.ENOSYS
    ops = [_op(LD_W_ABS, ARCH), _op(JEQ_K, spec["audit"], 1, 0), _op(RET_K, perm)]
    ops.append(_op(LD_W_ABS, NR))
    if arch == "x86_64":  # the x32 ABI's numbers carry this bit: none of them is allowed
        ops += [_op(JGE_K, X32_BIT, 0, 1), _op(RET_K, perm)]
    for nr in sorted(spec["numbers"].values()):
        ops += [_op(JEQ_K, nr, 0, 1), _op(RET_K, perm)]
    ops += [_op(JEQ_K, spec["clone3"], 0, 1), _op(RET_K, nosys)]
    ops += [
        _op(JEQ_K, spec["clone"], 0, 5),  # not clone: allowed
        _op(LD_W_ABS, ARG0),  # clone's flags
        _op(JSET_K, CLONE_NAMESPACES, 2, 0),  # a namespace: refused
        _op(JSET_K, CLONE_THREAD, 0, 1),  # not a thread: refused
        _op(RET_K, RET_ALLOW),
        _op(RET_K, perm),
    ]
    ops.append(_op(RET_K, RET_ALLOW))
    return b"".join(ops)


def _refuse_in_python() -> None:
    """The Python entries to refused calls raise with what to change (the filter would
    answer a bare EPERM)."""
    import _posixsubprocess

    def refuser(what: str):
        def refused(*args, **kwargs):
            raise SandboxRefusal(errno.EPERM, REFUSAL.format(what=what))

        refused.__name__ = what.rsplit(".", 1)[-1]
        return refused

    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "memfd_create", "unshare"):
        if hasattr(os, name):
            setattr(os, name, refuser(f"os.{name}"))
    _posixsubprocess.fork_exec = refuser("subprocess (a new process)")
    if "subprocess" in sys.modules:  # it took its own reference at import
        sys.modules["subprocess"]._fork_exec = _posixsubprocess.fork_exec


def install(machine: str | None = None) -> str:
    """Load the filter on every thread of this process; what was done, as one line.
    Raises OSError where the kernel refuses it (no learner code may then run)."""
    machine = machine or platform.machine()
    arch = supported(machine)
    if arch is None:
        return (
            f"seccomp: no filter for the architecture {machine!r} (only x86_64 and "
            "aarch64): processes and memfd are not refused in this sandbox"
        )
    code = program(arch)
    n = len(code) // 8
    buf = ctypes.create_string_buffer(code, len(code))
    prog = struct.pack("=HxxxxxxQ", n, ctypes.addressof(buf))  # struct sock_fprog
    prog_buf = ctypes.create_string_buffer(prog, len(prog))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp: PR_SET_NO_NEW_PRIVS failed")
    got = libc.syscall(
        ctypes.c_long(ARCHES[arch]["seccomp"]),
        ctypes.c_uint(SECCOMP_SET_MODE_FILTER),
        ctypes.c_uint(SECCOMP_FILTER_FLAG_TSYNC),
        prog_buf,
    )
    if got != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"seccomp: the filter was not loaded ({os.strerror(e)}, {got})")
    _refuse_in_python()
    return f"seccomp: {arch} filter of {n} instructions loaded"
