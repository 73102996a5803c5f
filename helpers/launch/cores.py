"""The cores a set of ranks really had during a timed run, and timing lessons checked only then.

A timing lesson rests on a premise about the machine: "with a core per rank the ping-pong model
predicts the parameter server", "with a core per rank the busiest rank sets the ring's pace". On
a busy machine (a laptop running other programs, a CI runner at load 10 on 2 cores) other
programs take the cores, and the timings measure them, not the lesson. So measure the premise.

Linux counts, for every thread, the time it ran and the time it was **ready to run but waited
for a core** (``/proc/self/task/*/schedstat``, fields 1 and 2). Summed over the threads of each
rank, over the timed part, and divided by its wall time:

* ``had``: the cores the ranks used, their CPU seconds over the wall time, summed over ranks;
* ``wanted``: the cores they would have used had nothing else run: (CPU + waiting) / wall.

The premise holds when the ranks had at least ``share`` (85 %) of the cores they wanted, up to
the machine's cores: ``had >= share * min(wanted, cores)``. A rank that waits for a message
wants no core meanwhile, so a ping-pong wants about one, a compute-bound ring one per rank.
Where the OS does not say how long threads waited (macOS, Windows), ``wanted`` is what the
caller says the work would use (``wants=``), by default one core per rank.

    from helpers.launch import cores

    def timed(d, n):
        with cores.clock() as c:          # in every rank, around the timed part
            ...                           # the timed work
        return result, c.reading

    out = launch.spawn(timed, world_size=2, args=(n,))
    premise = cores.premise([reading for _, reading in out])
    cores.check(premise, "the busiest rank sets the pace", ratio > 1.1, f"contiguous/balanced {ratio:.2f}x")

``check`` asserts the lesson (its message says what was found and what the ranks had) when the
premise holds; otherwise it prints what it measured and that the lesson could not be checked
here (``premise.holds`` says which). ``clocked(fn)`` wraps a rank function written without a clock.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable, Sequence

__all__ = ["Premise", "Reading", "check", "clock", "clocked", "machine_cores", "premise"]

SHARE = 0.85  # of the cores they wanted, the ranks must have had this share


@dataclasses.dataclass(frozen=True)
class Reading:
    """One rank's timed part: wall seconds, CPU seconds (all its threads), and the seconds its
    threads were ready to run but waited for a core (None where the OS does not say)."""

    wall_s: float
    cpu_s: float
    wait_s: float | None = None

    def __add__(self, other: Reading) -> Reading:  # two timed parts of one rank, back to back
        wait = None if self.wait_s is None or other.wait_s is None else self.wait_s + other.wait_s
        return Reading(self.wall_s + other.wall_s, self.cpu_s + other.cpu_s, wait)


def _thread_stats() -> dict[str, tuple[int, int]] | None:
    """{thread id: (ns run, ns ready but waiting)} of this process, or None off Linux."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    stats = {}
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run, wait = f.read().split()[:2]
            stats[tid] = (int(run), int(wait))
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
    return stats or None


class clock:  # noqa: N801 (used as a context manager, like a function)
    """``with clock() as c: ...`` then ``c.reading``: what this process's threads did meanwhile.

    A thread that ends inside the block takes its waiting time with it (undercounted)."""

    def __enter__(self) -> clock:
        self._stats = _thread_stats()
        self._cpu, self._wall = time.process_time(), time.perf_counter()
        self.reading: Reading | None = None
        return self

    def __exit__(self, *exc) -> None:
        wall, cpu = time.perf_counter() - self._wall, time.process_time() - self._cpu
        after, before, wait = _thread_stats(), self._stats, None
        if after is not None and before is not None:
            ran = sum(r - before.get(t, (0, 0))[0] for t, (r, _) in after.items())
            if ran > 0 or cpu < 0.01:  # a kernel without schedstats reports zeros
                wait = sum(w - before.get(t, (0, 0))[1] for t, (_, w) in after.items()) / 1e9
        self.reading = Reading(wall, cpu, None if wait is None else max(0.0, wait))


def clocked(fn: Callable) -> Callable:
    """``fn(d, *args)`` made to return ``(fn's value, its Reading)``: for ``launch.spawn``."""

    def run(d, *args):
        with clock() as c:
            value = fn(d, *args)
        return value, c.reading

    run.__name__ = run.__qualname__ = getattr(fn, "__name__", "run")
    return run


def machine_cores() -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup CPU quota."""
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


@dataclasses.dataclass(frozen=True)
class Premise:
    """What the ranks had against what they wanted; ``holds`` says whether timings test a lesson."""

    ranks: int
    cores: int
    had: float
    wanted: float
    measured: bool  # wanted measured from the threads' waiting time, or assumed
    share: float = SHARE
    extra: tuple[tuple[bool, str], ...] = ()
    who: str = ""  # what was timed, in words ("the kernel"); default: "N ranks"

    @property
    def could_use(self) -> float:
        return min(self.wanted, self.cores)

    @property
    def holds(self) -> bool:
        return self.had >= self.share * self.could_use and all(ok for ok, _ in self.extra)

    def requiring(self, condition: bool, what: str) -> Premise:
        """The same premise, holding only if ``condition`` too (``what`` says what it needs)."""
        return dataclasses.replace(self, extra=(*self.extra, (bool(condition), what)))

    @property
    def crowded(self) -> bool:
        """Other programs took cores the ranks wanted (the measured part of the premise fails)."""
        return self.had < self.share * self.could_use

    def __str__(self) -> str:
        how = "CPU + waiting for a core" if self.measured else "assumed: this OS does not say"
        who = self.who or f"{self.ranks} rank{'s' * (self.ranks != 1)}"
        text = (
            f"{who} had {self.had:.2f} of the {self.could_use:.2f} cores "
            f"{'they' if self.ranks != 1 else 'it'} could use ({self.wanted:.2f} wanted, {how}; {self.cores} cores here)"
        )
        return text + "".join(
            f"; the lesson needs {what}: not so" for ok, what in self.extra if not ok
        )


def premise(readings: Sequence[Reading], *, wants: float | None = None, share: float = SHARE,
            cores: int | None = None, who: str = "") -> Premise:  # fmt: skip
    """The cores ``readings`` (one per rank, or per timed part) had and wanted; ``wants`` is
    the cores the work would use where the OS does not say (default: one per reading);
    ``who`` names what was timed where it is not ranks ("the kernel")."""
    readings = list(readings)
    if not readings or any(not isinstance(r, Reading) for r in readings):
        raise TypeError(
            f"premise needs the Reading of each rank (from cores.clock), got {readings!r}"
        )
    had = sum(r.cpu_s / r.wall_s for r in readings if r.wall_s > 0)
    measured = all(r.wait_s is not None for r in readings)
    if measured:
        wanted = sum((r.cpu_s + r.wait_s) / r.wall_s for r in readings if r.wall_s > 0)
    else:
        wanted = float(len(readings) if wants is None else wants)
    return Premise(
        len(readings), cores or machine_cores(), had, max(wanted, had), measured, share, who=who
    )


def check(premise: Premise, lesson: str, ok: bool, found: str) -> None:
    """Assert ``ok`` (the lesson; ``found`` says what was measured) when ``premise`` holds;
    otherwise print what was found and that the lesson could not be checked here."""
    if premise.holds:
        assert ok, f"{lesson}: not so here, found {found}, although {premise}"
        print(f"checked: {lesson}: {found} ({premise})")
        return
    # not holding: other programs took the cores, or a condition of the lesson (``requiring``)
    # was not met, which str(premise) names
    why = " Other programs took cores, and the timings measure them too." if premise.crowded else ""
    agrees = "agrees" if ok else "does not agree"
    print(f"not checked here: {lesson}. Found {found}, which {agrees}; but {premise}.{why}")
