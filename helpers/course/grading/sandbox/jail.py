"""Inside a sandbox slot: the namespaces of one job, made by its forked child before any learner code.

The slot is a long-lived sandbox (bubblewrap; torch imported once), shared by the jobs of
every learner it grades. Each job's process (a rank, or the learner process of direct
calls) is forked from it and, before it runs anything of the learner's, calls
``enter(job)``:

* a private IPC namespace: SysV shared memory, semaphores, message queues and POSIX
  queues of one job are gone when it ends and never seen by the next (another learner's);
* a private mount namespace with fresh, size-capped tmpfs on ``/tmp``, ``/dev/shm`` and
  the scratch directory (its working directory): nothing one job writes reaches another;
  ``/proc`` read-only (a rank that made itself dumpable could otherwise reset the memory
  high-water mark the grader reads from outside, through ``/proc/self/clear_refs``), and
  ``/dev`` (bubblewrap's tmpfs, whose files the grader would not count), its device nodes
  and ``/dev/shm`` being mounts of their own;
* the modules the lab refuses (its grading.toml), absent: the directory that holds a
  refused module file is covered by an empty tmpfs into which every other entry is bound
  back (read-only; ``__pycache__`` left out, so no compiled copy stays either); a refused
  package's own directory is covered by one that holds only an ``__init__.py`` raising
  ModuleNotFoundError. An import, a path, a ``spec_from_file_location`` or ``open`` finds
  nothing of them. A refused module that the slot itself had loaded before the job (part
  of torch's own start-up or the slot's preload: torch.nn.parallel, torch.distributed.
  tensor, ...) leaves this job's ``sys.modules`` with its submodules and its package's
  attribute, and its files are covered as well: ``import``, ``__import__``,
  ``importlib.import_module`` (torch.importlib's too) and ``sys.modules`` find nothing. Its
  objects that other loaded modules hold stay in memory (``torch.nn.DataParallel``, a
  DTensor class an FSDP module imported): the guard and the recorded messages answer for
  those;
* resource limits: processes in the sandbox, bytes of data per process, file size;
* then every capability is dropped (the slot keeps CAP_SYS_ADMIN in its own user
  namespace to make these mounts; the learner's code never has it), and the result is
  checked: a child that still holds a capability exits instead of running the job;
* last, a seccomp filter (helpers.course.grading.sandbox.seccomp): no new process, no
  memfd, shared memory segment, message queue or io_uring, no new namespace: memory the
  job holds is memory the grader counts.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys

from helpers.course.grading.sandbox import seccomp

__all__ = ["SCRATCH", "enter"]

SCRATCH = "/scratch"  # the working directory, HOME, in every sandbox: the same path everywhere
WRITABLE = (("/tmp", 0o1777), ("/dev/shm", 0o1777), (SCRATCH, 0o700))
TMPFS_BYTES = 1 << 30
CLONE_NEWNS, CLONE_NEWIPC = 0x00020000, 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_NOATIME = 1, 2, 4, 8, 32, 1024
MS_RELATIME, ST_RELATIME, ST_RDONLY = 1 << 21, 4096, 1
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
CAPABILITY_V3 = 0x20080522
STUB = "No module named {!r}: the lab refuses it, and its sandbox does not have it"

_libc = ctypes.CDLL(None, use_errno=True)


class JailError(RuntimeError):
    """The job's namespaces could not be made: the job does not run."""


def _ok(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise JailError(f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _ok(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def _read_only(path: str) -> None:
    """Remount ``path`` read-only, keeping the flags it has (a user namespace may not clear
    the ones its mount came with)."""
    kept = os.statvfs(path).f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME)
    relatime = MS_RELATIME if os.statvfs(path).f_flag & ST_RELATIME else 0
    _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept | relatime)


def _tmpfs(path: str, mode: int, size: int) -> None:
    _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode={mode:o}")
    os.chmod(path, mode)  # the umask took bits from the mode


def _cover(parent: str, gone: set[str], mode: int = 0o755, size: int = 1 << 20) -> None:
    """``parent`` as a new tmpfs: the entries ``gone`` (and its __pycache__) absent, the rest
    bound back read-only. Writable (``mode``) when nothing is gone: a job's fresh /tmp, where
    the interpreter or the venv may sit bound (a class venv under /tmp) and stays."""
    keep = sorted(set(os.listdir(parent)) - gone - ({"__pycache__"} if gone else set()))
    fd = os.open(parent, os.O_PATH | os.O_DIRECTORY)
    try:
        _tmpfs(parent, mode, size)
        for name in keep:
            src, dst = f"/proc/self/fd/{fd}/{name}", os.path.join(parent, name)
            if os.path.islink(src):
                os.symlink(os.readlink(src), dst)
                continue
            if os.path.isdir(src):
                os.mkdir(dst)
            else:
                open(dst, "w").close()
            _mount(src, dst, None, MS_BIND | MS_REC)
            if not os.statvfs(src).f_flag & ST_RDONLY:  # a bind keeps its source's read-only
                _read_only(dst)
    finally:
        os.close(fd)
    if gone:
        _read_only(parent)


def _loaded(module: str) -> bool:
    return any(m == module or m.startswith(module + ".") for m in list(sys.modules))


def _stub(package: str, module: str) -> None:
    """A package directory emptied: only an ``__init__.py`` that raises as a missing module
    does (cheaper than covering its parent, site-packages, and binding hundreds back)."""
    _tmpfs(package, 0o755, 1 << 16)
    with open(os.path.join(package, "__init__.py"), "w") as f:
        f.write(f"raise ModuleNotFoundError({STUB.format(module)!r}, name={module!r})\n")
    _read_only(package)


def _unload(module: str) -> None:
    """``module`` and its submodules out of this job's ``sys.modules``, and off its package
    (``from package import name`` reads the attribute before it imports)."""
    for name in [m for m in list(sys.modules) if m == module or m.startswith(module + ".")]:
        del sys.modules[name]
    parent, _, child = module.rpartition(".")
    if parent in sys.modules and child in vars(sys.modules[parent]):
        delattr(sys.modules[parent], child)


def hide(pairs) -> list[str]:
    """Make each (module, path) absent, outermost first; the modules it took out of memory."""
    todo: dict[str, tuple[str, set[str]]] = {}  # directory -> (module, entries to remove)
    in_memory = []
    for module, path in pairs:
        if _loaded(module):
            in_memory.append(module)
            _unload(module)
        path = os.path.normpath(path)
        if os.path.isdir(path):
            todo[path] = (module, set())  # a package: stubbed
        else:  # a module file: its directory covered without it (nor its compiled copy)
            todo.setdefault(os.path.dirname(path), (module, set()))[1].add(os.path.basename(path))
    for directory in sorted(todo, key=lambda p: p.count(os.sep)):
        module, gone = todo[directory]
        if not os.path.isdir(directory):
            continue  # inside a package stubbed already
        if not gone:
            _stub(directory, module)
        elif gone := {n for n in gone if os.path.lexists(os.path.join(directory, n))}:
            _cover(directory, gone)
    return in_memory


def _limits(limits: dict) -> None:
    for name, value in limits.items():
        kind = getattr(resource, f"RLIMIT_{name.upper()}")
        soft, hard = resource.getrlimit(kind)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(kind, (value, value))


def _capabilities() -> dict[str, int]:
    with open("/proc/self/status") as f:
        rows = [line.split(":", 1) for line in f if line.startswith("Cap")]
    return {k: int(v, 16) for k, v in rows}


def drop_capabilities() -> None:
    """No capability left, in any set, and none to be gained by exec."""
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for cap in range(64):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last one: ignored
    header = (ctypes.c_uint32 * 2)(CAPABILITY_V3, 0)
    data = (ctypes.c_uint32 * 6)()
    _ok(_libc.capset(header, data), "capset")
    _ok(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    left = {k: v for k, v in _capabilities().items() if v}
    if left:
        raise JailError(f"capabilities left after dropping them: {left}")


def enter(job: dict) -> list[str]:
    """The job's own namespaces (see the module docstring); the refused modules it took out
    of memory. Raises JailError, in which case no learner code may run."""
    _ok(_libc.unshare(CLONE_NEWNS | CLONE_NEWIPC), "unshare (mount, IPC)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    size = int(job.get("tmpfs_bytes", TMPFS_BYTES))
    for path, mode in WRITABLE:
        _cover(path, set(), mode, size)
    _read_only("/proc")  # no /proc/self/clear_refs: the grader's reading of memory stays its own
    _read_only("/dev")  # bwrap's /dev is a tmpfs the grader does not read: nothing kept there
    in_memory = hide(job.get("hide", ()))
    os.chdir(SCRATCH)
    _limits(job.get("limits", {}))
    drop_capabilities()
    said = seccomp.install()
    if not said.endswith("loaded"):  # an architecture without a filter: say so in the log
        print(said, file=sys.stderr)
    return in_memory
