"""The sandbox's command line: bubblewrap, as user nobody, seeing only what a learner's code needs.

Why bubblewrap (``bwrap``) and not ``unshare``: one command sets up every namespace
(user, PID, network, IPC, UTS, cgroup), a root of its own, a fresh ``/dev`` and ``/proc``,
a clean environment, and it kills the sandbox when the grader dies (``--die-with-parent``)
and forbids new user namespaces inside (``--disable-userns``). ``unshare`` gives the
namespaces only: the mounts, the environment and the parent-death rule would be ours to
write, as root, in a shell script. bwrap runs unprivileged (Debian and Ubuntu ship it;
user namespaces are on by default), so a learner's Validate can use it as well as the
instructor's autograde, and the instructor need not be root.

What a command looks like (``command``):

    [bwrap (root only: makes the interpreter reachable, below)]
      setpriv --reuid 65534 --regid 65534 --clear-groups      (root only: uid nobody)
        bwrap --unshare-all --unshare-user --disable-userns --die-with-parent --new-session
              --as-pid-1 --uid 65534 --gid 65534 --cap-add CAP_SYS_ADMIN --cap-add CAP_SETPCAP
              --ro-bind /usr /usr (and the /bin, /lib links, the loader's files in /etc)
              --dev /dev --proc /proc --tmpfs /tmp --tmpfs /dev/shm
              --ro-bind PATH PATH   for the interpreter, the venv, helpers/ and data/
              --dir /scratch --chdir /scratch --remount-ro /
              --clearenv --setenv PATH ... HOME /scratch PYTHONPATH ... WORKBOOK_SANDBOX 1
          python -m helpers.course.grading.sandbox.slot FD

The root is empty but for those: no home, no course directory, no other learner's files,
no checkout beyond ``helpers/``. Inside, everyone is uid 65534 and the paths are the same
in autograde and in Validate; the slot is PID 1 (no bwrap in the sandbox, so nothing
there shows the grader's environment, which bwrap itself is not given either:
``launch_environment``). The slot keeps two capabilities in its own user namespace, to
give each job its own mount and IPC namespaces (helpers.course.grading.sandbox.jail); each
job drops them before it runs learner code.

Run as root, the grader drops to nobody before bubblewrap starts, so the learner's
processes are nobody outside the sandbox too, not a namespace's alias of root. When
nobody cannot reach the interpreter or the package (pyenv under ``/root``, mode 0700), a
first bwrap, still root, covers the unreachable directory with a tmpfs that lets nobody
pass and binds the needed trees back read-only; it unshares only the mount namespace.
"""

from __future__ import annotations

import os
import shutil
import site
import sys
import sysconfig
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from helpers.course.grading.sandbox import jail
from helpers.course.grading.sandbox.jail import SCRATCH
from helpers.course.grading.sandbox.reach import reachability_layer

__all__ = [
    "NOBODY",
    "SandboxUnavailable",
    "command",
    "hidden_paths",
    "launch_environment",
    "needed_paths",
    "require",
]

NOBODY = 65534
# What a course directory holds that learner code must never read: the instructor's
# source labs and hidden tests, other learners' work, the grades, the history.
COURSE_SECRETS = (
    "solutions",
    "source",
    "submitted",
    "autograded",
    "feedback",
    "gradebook.db",
    ".git",
)

# Of /etc, what the dynamic loader and the clock read; nothing about the machine's users.
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime")
CPU_INFO = ("/sys/devices/system/cpu",)  # torch's cpuinfo reads the processor list here

INSTALL = (
    "grading runs learners' code inside bubblewrap, which this machine lacks: install it "
    "(Debian/Ubuntu: `sudo apt-get install bubblewrap`; Fedora: `sudo dnf install bubblewrap`) "
    "and grade again. Without it nothing is graded: the learner's code would run with the "
    "grader's rights."
)


class SandboxUnavailable(RuntimeError):
    """The machine cannot sandbox learner code; the message says what to install."""


def require() -> str:
    """The path of bwrap (and of setpriv when running as root), or SandboxUnavailable."""
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable(INSTALL)
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        raise SandboxUnavailable(
            "grading as root drops to user nobody with setpriv, which this machine lacks: "
            "install util-linux (`sudo apt-get install util-linux`)"
        )
    return path


def needed_paths() -> list[Path]:
    """What the sandbox's python reads: the interpreter, its standard library, the venv's
    packages, the ``helpers`` package and the data directory."""
    paths = {
        Path(sys.prefix),
        Path(sys.base_prefix),
        Path(sys.executable).resolve().parent,
        Path(__file__).resolve().parents[3],  # helpers/, not the checkout around it
    }
    data = _data_dir()
    if data is not None:
        paths.add(data)
    for p in [*sysconfig.get_paths().values(), *site.getsitepackages()]:
        paths.add(Path(p))
    # Package directories a .pth file put on the path (a class venv that borrows another's
    # packages): only site directories, never the script's directory or the course's.
    paths.update(Path(p) for p in sys.path if Path(p).name in ("site-packages", "dist-packages"))
    return sorted({p.resolve() for p in paths if p.exists()})


def hidden_paths(course_root: Path | None, extra: Iterable[Path] = ()) -> list[Path]:
    """Paths to cover: the course's secrets, the checkout's, nbgrader's exchange, the
    grader's temp dir when it is not /tmp (which the sandbox replaces anyway)."""
    roots = {Path(__file__).resolve().parents[4]}
    if course_root is not None:
        roots.add(Path(course_root).resolve())
    out = [root / name for root in roots for name in COURSE_SECRETS]
    out.append(Path(os.environ.get("NBGRADER_EXCHANGE", "/srv/nbgrader/exchange")))
    tmp = Path(tempfile.gettempdir()).resolve()
    if tmp != Path("/tmp"):
        out.append(tmp)
    out += [Path(p) for p in extra]
    return sorted({p for p in out if p.exists() or p.is_symlink()})


def _environment(threads: int) -> list[str]:
    """The sandbox's whole environment: the same in autograde and Validate, nothing of the
    grader's (no NBGRADER_*, no paths of the course)."""
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": SCRATCH,
        "USER": "nobody",
        "LOGNAME": "nobody",
        "TMPDIR": "/tmp",
        "PYTHONPATH": str(_checkout()),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "PYTHONSAFEPATH": "1",  # the scratch directory is never an import root
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "WORKBOOK_SANDBOX": "1",
        "LANG": "C.UTF-8",
    }
    data = _data_dir()
    if data is not None:
        env["WORKBOOK_DATA"] = str(data)
    for key in ("KINETO_LOG_LEVEL", "DS_ACCELERATOR", "TORCH_LOGS", "PYTHONWARNINGS"):
        if key in os.environ:
            env[key] = os.environ[key]
    out = ["--clearenv"]
    for key, value in env.items():
        out += ["--setenv", key, value]
    return out


def _checkout() -> Path:
    """The directory that holds the ``helpers`` package (the sandbox sees only ``helpers``)."""
    return Path(__file__).resolve().parents[4]


def _data_dir() -> Path | None:
    data = os.environ.get("WORKBOOK_DATA") or _checkout() / "data"
    return Path(data).resolve() if Path(data).is_dir() else None


def _system() -> list[str]:
    """The system's programs and libraries, read-only; of /etc only what the loader reads."""
    out = []
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        path = Path(top)
        if path.is_symlink():
            out += ["--symlink", os.readlink(path), top]
        elif path.is_dir():
            out += ["--ro-bind", top, top]
    for name in SYSTEM_FILES:
        if Path(name).exists():
            out += ["--ro-bind", name, name]
    return out


def command(argv: Sequence[str], *, hide: Sequence[Path] = (), threads: int = 1) -> list[str]:
    """The command that runs ``argv`` in a sandbox (see the module docstring).

    The sandbox sees the system (/usr and the loader's files), the interpreter, the venv's
    packages, the ``helpers`` package and the data directory, read-only; an empty /tmp,
    /dev/shm and /scratch (its working directory); its own /proc and /dev. Nothing else:
    no home, no course directory, no other learner's files. ``hide``: paths among those
    to cover all the same (directories read as empty, files as /dev/null). Each job then
    makes its own namespaces inside (helpers.course.grading.sandbox.jail).
    """
    bwrap = require()
    needed = [p for p in needed_paths() if p != Path("/")]
    mounts = [*_system(), "--dev", "/dev", "--proc", "/proc"]
    mounts += ["--size", str(jail.TMPFS_BYTES), "--tmpfs", "/tmp"]
    mounts += ["--size", str(jail.TMPFS_BYTES), "--tmpfs", "/dev/shm"]
    for p in _outermost(needed):
        mounts += ["--ro-bind", str(p), str(p)]
    for p in CPU_INFO:
        if Path(p).is_dir():
            mounts += ["--ro-bind", p, p]
    for p in (Path(p) for p in hide):
        if not any(p == n or n in p.parents for n in needed):
            continue  # not in the sandbox at all: a mount point would only name it there
        if p.is_dir() and not p.is_symlink():
            mounts += ["--tmpfs", str(p), "--remount-ro", str(p)]
        elif p.exists():
            mounts += ["--ro-bind", "/dev/null", str(p)]
    mounts += ["--dir", SCRATCH, "--chdir", SCRATCH, "--remount-ro", "/"]
    inner = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--as-pid-1",  # the slot is PID 1: no bwrap (nor its environment) inside
        "--uid",
        str(NOBODY),
        "--gid",
        str(NOBODY),
        "--cap-add",
        "CAP_SYS_ADMIN",  # the slot's, in its own user namespace: it makes each job's mounts
        "--cap-add",
        "CAP_SETPCAP",  # and lets the job drop every capability before it runs
        "--hostname",
        "sandbox",
        *mounts,
        *_environment(threads),
        *argv,
    ]
    if os.geteuid() != 0:
        return inner
    drop = [
        shutil.which("setpriv") or "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        "--inh-caps=-all",
    ]
    return [*reachability_layer(needed, NOBODY), *drop, *inner]


def launch_environment() -> dict[str, str]:
    """The environment bwrap itself starts with: nothing of the grader's (its own variables
    would otherwise be readable in the sandbox as those of its parent)."""
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def _outermost(paths: Sequence[Path]) -> list[Path]:
    return [p for p in paths if not any(q in p.parents for q in paths)]
