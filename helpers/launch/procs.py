"""Process trees: environment for child interpreters, and stopping a whole tree.

Ranks must never outlive the launch that started them. torchrun starts each
rank in a session of its own, so signalling torchrun's process group does not
reach them; psutil walks the tree by parentage instead (Linux and macOS alike).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil

__all__ = ["descendants", "package_pythonpath", "stop_tree"]

# The checkout (or site-packages directory) that holds the helpers package.
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


def package_pythonpath(existing: str | None = None) -> str:
    """PYTHONPATH that makes this ``helpers`` importable in child processes, first."""
    parts = [PACKAGE_PARENT, *(existing or "").split(os.pathsep)]
    return os.pathsep.join(dict.fromkeys(p for p in parts if p))  # dedupe, keep order


def descendants(pid: int) -> list[psutil.Process]:
    """Every live process below ``pid`` (children, grandchildren, ...)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def stop_tree(
    pid: int, known: list[psutil.Process] = (), grace: float = 3.0, include_root: bool = True
) -> None:
    """SIGTERM ``pid`` (torchrun then stops its ranks itself), then SIGKILL what is left.

    known: processes seen below pid earlier; they are killed too, even if they
    were re-parented after their parent died. include_root=False leaves pid
    itself alone (a caller that holds it as a Popen reaps it, keeping its exit code). The SIGKILL step always runs: an
    interrupt during the grace period cannot skip it (callers run this in a
    process of its own, helpers.launch.reaper, or with interrupts deferred).
    """
    tree = {p.pid: p for p in [*known, *descendants(pid)]}
    root = []
    if include_root:
        try:
            root = [psutil.Process(pid)]
        except psutil.NoSuchProcess:
            root = []
    try:
        for p in root:
            p.send_signal(signal.SIGTERM)
        psutil.wait_procs(root, timeout=grace)
    except psutil.Error:
        pass
    finally:
        tree.update({p.pid: p for p in descendants(pid)})
        victims = [*root, *tree.values()]
        for p in victims:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(victims, timeout=grace)
