"""Root only: the interpreter and the workbook made reachable for nobody, before bwrap drops to it.

Grading as root drops to user nobody before the sandbox starts (helpers.course.grading.
sandbox.bwrap). When nobody cannot reach the interpreter or the package (pyenv under
``/root``, mode 0700), ``reachability_layer`` is a first bwrap, still root, that covers
the unreachable directory with a tmpfs that lets nobody pass and binds the needed trees
back read-only; it unshares only the mount namespace. Empty when nobody reaches them all.
"""

from __future__ import annotations

import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

__all__ = ["reachability_layer"]


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


def reachability_layer(needed: Sequence[Path], uid: int) -> list[str]:
    """Root only: a bwrap that makes ``needed`` reachable for nobody (empty if it is)."""
    covers = sorted(
        {
            c
            for p in needed
            if not _reachable(p, uid)
            for c in [_covered_ancestor(p, uid)]
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
