"""Which process of a sandbox slot is its rank, as the grading process's /proc names it.

The relay's memory samples (helpers.course.grading.relay.probes) read a rank's
``/proc/<pid>/status`` from the grading process, so they need the rank's pid there, and a
rank cannot be asked (it could name another process). A slot's sandbox holds the slot's
python, PID 1 in its own PID namespace, and the processes it forks: the rank of the coming
job, forked ahead of it, is the oldest of its children (whatever the rank's code forks
later, and is re-parented to the slot, is younger).

    pid_of = RankPids([slot.proc.pid for slot in slots])   # the bwrap processes
    pid_of(0)                                              # rank 0's pid, found once
    pid_of.slot(0)                                         # the slot's python

The rank is forked when its job reaches the slot (or just before), so it is looked for when
the relay first hears from it, not when the job's switch is made.
"""

from __future__ import annotations

import os

__all__ = ["RankPids", "rank_pid", "slot_pid"]


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of ``pid``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19])


def _children() -> dict[int, list[tuple[int, int]]]:
    """parent -> [(start time, pid), ...] of every process this one can see."""
    out: dict[int, list[tuple[int, int]]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                out.setdefault(st[0], []).append((st[1], int(name)))
    return out


def _inner_pid(pid: int) -> int | None:
    """``pid``'s number in its innermost PID namespace."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None


def slot_pid(sandbox: int, tree: dict | None = None) -> int | None:
    """The slot's python (PID 1 of its namespace) in the sandbox started as ``sandbox``."""
    tree = _children() if tree is None else tree
    todo = [sandbox]
    while todo:
        pid = todo.pop()
        for _, child in tree.get(pid, []):
            if _inner_pid(child) == 1:
                return child
            todo.append(child)
    return None


def rank_pid(sandbox: int) -> int | None:
    """The rank process in the sandbox started as ``sandbox`` (its bwrap), or None."""
    tree = _children()
    slot = slot_pid(sandbox, tree)
    if slot is None or not tree.get(slot):
        return None
    return min(tree[slot])[1]


class RankPids:
    """``pid_of(rank)`` for one job: each rank's pid, found when first asked after the rank
    exists (the slot forks it as the job arrives); ``slot(rank)``: its slot's python, whose
    memory the rank starts from (see the module docstring)."""

    def __init__(self, sandboxes: list[int]):
        self.sandboxes = sandboxes
        self.found: dict[int, int] = {}

    def __call__(self, rank: int) -> int | None:
        if rank not in self.found:
            pid = rank_pid(self.sandboxes[rank])
            if pid is None:
                return None
            self.found[rank] = pid
        return self.found[rank]

    def slot(self, rank: int) -> int | None:
        return slot_pid(self.sandboxes[rank])
