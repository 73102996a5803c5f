"""The sandbox's command line: bubblewrap, as user nobody, with a filesystem it cannot change.

Why bubblewrap (``bwrap``) and not ``unshare``: one command sets up every namespace
(user, PID, network, IPC, UTS, cgroup), a read-only view of ``/``, a fresh ``/dev`` and
``/proc``, a private ``/tmp``, the paths it must not see covered, a clean environment, and
it kills the sandbox when the grader dies (``--die-with-parent``) and forbids new user
namespaces inside (``--disable-userns``). ``unshare`` gives the namespaces only: the mounts,
the environment and the parent-death rule would be ours to write, as root, in a shell
script. bwrap runs unprivileged (Debian and Ubuntu ship it; user namespaces are on by
default), so a learner's Validate can use it as well as the instructor's autograde.

What a command looks like (``command``):

    [bwrap (root only: makes the interpreter reachable, below)]
      setpriv --reuid 65534 --regid 65534 --clear-groups      (root only: uid nobody)
        bwrap --unshare-all --unshare-user --disable-userns --die-with-parent --new-session
              --ro-bind / /  --dev /dev  --tmpfs /dev/shm  --proc /proc  --tmpfs /tmp
              --tmpfs $HOME  (then the interpreter and the package bound back, read-only)
              --tmpfs DIR / --ro-bind /dev/null FILE   for each hidden path
              --bind SCRATCH SCRATCH                   the one writable place
              --clearenv --setenv PATH ... HOME SCRATCH PYTHONPATH ... WORKBOOK_SANDBOX 1
          python ...

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
import stat
import sys
import sysconfig
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["NOBODY", "SandboxUnavailable", "command", "hidden_paths", "needed_paths", "require"]

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
    packages and the directory that holds the ``helpers`` package."""
    paths = {
        Path(sys.prefix),
        Path(sys.base_prefix),
        Path(sys.executable).resolve().parent,
        Path(__file__).resolve().parents[4],
    }
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


def _reachable(path: Path, uid: int) -> bool:
    """Can ``uid`` (no groups) walk down to ``path``? Only 'other' bits count for it."""
    for p in [*reversed(path.parents), path]:
        try:
            st = p.stat()
        except OSError:
            return False
        if st.st_uid == uid:
            continue
        if stat.S_ISDIR(st.st_mode) and not st.st_mode & stat.S_IXOTH:
            return False
    return True


def _covered_ancestor(path: Path, uid: int) -> Path | None:
    """The highest directory above ``path`` that ``uid`` cannot pass, if any."""
    for p in [*reversed(path.parents), path]:
        st = p.stat()
        if st.st_uid != uid and stat.S_ISDIR(st.st_mode) and not st.st_mode & stat.S_IXOTH:
            return p
    return None


def _bind_back(needed: Sequence[Path], covers: Sequence[Path]) -> list[str]:
    """Read-only binds of the needed paths that sit under one of ``covers`` (outermost only)."""
    under = [p for p in needed if any(p == c or c in p.parents for c in covers)]
    tops = [p for p in under if not any(q in p.parents for q in under)]
    return [arg for p in tops for arg in ("--ro-bind", str(p), str(p))]


def _reachability_layer(needed: Sequence[Path]) -> list[str]:
    """Root only: a bwrap that makes ``needed`` reachable for nobody (empty if it is)."""
    covers = sorted(
        {
            c
            for p in needed
            if not _reachable(p, NOBODY)
            for c in [_covered_ancestor(p, NOBODY)]
            if c is not None
        }
    )
    if not covers:
        return []
    args = [
        shutil.which("bwrap") or "bwrap",
        "--die-with-parent",
        "--bind",
        "/",
        "/",
        "--dev-bind",
        "/dev",
        "/dev",
        "--bind",
        "/proc",
        "/proc",
    ]
    for c in covers:
        args += ["--perms", "0755", "--tmpfs", str(c)]
    binds = _bind_back(needed, covers)
    for target in binds[2::3]:  # bwrap would make the directories on the way 0700
        for a in reversed(Path(target).parents):
            if any(c in a.parents for c in covers):
                args += ["--perms", "0755", "--dir", str(a)]
    return args + binds


def _environment(scratch: Path, threads: int) -> list[str]:
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(scratch),
        "TMPDIR": "/tmp",
        "PYTHONPATH": str(Path(__file__).resolve().parents[4]),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "PYTHONSAFEPATH": "1",  # the scratch directory is never an import root
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "WORKBOOK_SANDBOX": "1",
        "LANG": "C.UTF-8",
    }
    data = Path(__file__).resolve().parents[4] / "data"  # datasets, read-only (helpers.data)
    if os.environ.get("WORKBOOK_DATA") or data.is_dir():
        env["WORKBOOK_DATA"] = os.environ.get("WORKBOOK_DATA") or str(data)
    for key in ("KINETO_LOG_LEVEL", "DS_ACCELERATOR", "TORCH_LOGS", "PYTHONWARNINGS"):
        if key in os.environ:
            env[key] = os.environ[key]
    out = ["--clearenv"]
    for key, value in env.items():
        out += ["--setenv", key, value]
    return out


def command(
    argv: Sequence[str], *, scratch: Path, hide: Sequence[Path] = (), threads: int = 1
) -> list[str]:
    """The command that runs ``argv`` in a sandbox whose only writable place is ``scratch``.

    ``hide``: directories become empty, files read as /dev/null. The caller's home is
    hidden too, but for the interpreter and the package it holds, bound back read-only.
    """
    bwrap = require()
    scratch = Path(scratch).resolve()
    needed = needed_paths()
    home = Path(os.path.expanduser("~")).resolve()
    mounts = [
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--tmpfs",
        "/dev/shm",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
    ]
    covers = [Path("/tmp")]
    if home != Path("/") and home.is_dir():
        mounts += ["--tmpfs", str(home)]
        covers.append(home)
    mounts += _bind_back(needed, covers)
    for p in hide:
        p = Path(p)
        if p.is_dir() and not p.is_symlink():
            mounts += ["--tmpfs", str(p)]
            covers.append(p)
        elif p.exists():
            mounts += ["--ro-bind", "/dev/null", str(p)]
    mounts += ["--bind", str(scratch), str(scratch), "--chdir", str(scratch)]
    for p in [*covers[1:], Path("/dev")]:  # read-only too (but /dev/shm): nothing to plant
        mounts += ["--remount-ro", str(p)]
    inner = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
        *mounts,
        *_environment(scratch, threads),
        *argv,
    ]
    if os.geteuid() != 0:
        return inner
    drop = [
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        "--inh-caps=-all",
    ]
    return [*_reachability_layer(needed), *drop, *inner]
