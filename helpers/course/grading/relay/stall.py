"""Whether a rank waits for a reply the relay holds back: read from /proc, not from the rank.

While the switch holds the reply to an all-reduce a rank started during backward (probes.py),
a DDP that overlaps goes on computing its backward and sends its next all-reduce or gate
soon, having burnt little CPU. A hook that waits for that reply, however it waits, sends
nothing until it gives up, and meanwhile its process either **burns CPU** (a busy poll of
``is_completed()``, a ``sched_yield`` loop, a spinning helper thread) or **sleeps** (a
blocking ``wait``, ``time.sleep`` polls, a thread or child it joins). ``Stall`` measures both
for one held reply, from outside the rank, at the switch's ticks and as the reply is
released, added up over the held replies of one backward (``spent``: a wait too short to
see in one hook shows over the hooks of a backward):

* ``cpu_s``: CPU time of every thread of the rank's process since the hold began (the sum of
  /proc/<pid>/task/*/schedstat, in ns; and /proc/<pid>/stat's utime + stime, which keeps
  the time of threads that have ended; the larger of the two);
* ``asleep_s``: wall time between two consecutive ticks at both of which no thread of the
  process was running or runnable (``asleep``) at the grader's own priority or above: a
  thread the rank made nicer than the grader, or put under SCHED_IDLE, counts as asleep, so
  a wait cannot hide behind a low-priority thread kept runnable, nor spin unseen at a
  priority that gets it little CPU. The switch reads every message that has arrived before
  it ticks, so a rank asleep at two ticks with the reply still held sent nothing in
  between: it was waiting, not communicating.

A rank preempted by others' load is neither (runnable, not running): load makes a correct
rank slower, never a stalled one; a spinning one gets less CPU per second under load, but
the limit is CPU, not time, so its wait is seen later, not missed (at 1/14 of a core, a
0.3 s spin in each of two hooks burns 0.04 s). Measured on lab 6's TinyNet (2026-11-29, 2
cores at load 10): a correct DDP, either kind, burnt at most 0.0024 s and slept at most
0.008 s in a backward, against limits of 0.02 s and 0.1 s. Limits (docs/instructors.md): a
wait that burns less than ``CPU_S`` and sleeps less than ``ASLEEP_S`` in a whole backward
is not seen (a spin of a few ms per hook); a thread in uninterruptible sleep ("D": a page
fault, a vfork) counts as running.
"""

from __future__ import annotations

import os
import time

__all__ = ["ASLEEP_S", "CPU_S", "Stall", "asleep", "cpu_s"]

CPU_S = 0.02  # CPU a rank burns in a backward with a reply held and nothing sent: it spins
ASLEEP_S = 0.1  # ... or sleeps this long in all: it waits for its replies
_TICK = os.sysconf("SC_CLK_TCK")
_SCHED_IDLE = 5


def cpu_s(pid: int | None) -> float | None:
    """CPU seconds of every thread of ``pid`` so far (see the module docstring), or None."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        whole = (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (ended threads too)
        tasks = os.listdir(f"/proc/{pid}/task")
    except (OSError, IndexError, ValueError):
        return None
    ns = 0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns += int(f.read().split()[0])
        except (OSError, IndexError, ValueError):
            continue
    return max(whole, ns / 1e9)


def asleep(pid: int | None, nice: int) -> bool:
    """Is no thread of ``pid`` running or runnable at niceness ``nice`` or below, under a
    policy other than SCHED_IDLE? (False when /proc cannot say.)"""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except (OSError, TypeError):
        return False
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            state, niceness, policy = fields[0], int(fields[16]), int(fields[38])
        except (OSError, IndexError, ValueError):
            continue
        if state in ("R", "D") and niceness <= nice and policy != _SCHED_IDLE:
            return False
    return True


class Stall:
    """What one rank did while one reply was held, added to ``spent`` (CPU s, asleep s: its
    earlier holds in the same backward, so that a wait shorter than the limits in each hook
    adds up over the hooks of a backward; see the module docstring)."""

    def __init__(self, pid: int | None, spent: tuple[float, float] = (0.0, 0.0)):
        self.pid = pid
        self.nice = os.getpriority(os.PRIO_PROCESS, 0)  # the grading process's own
        self.cpu0 = cpu_s(pid)
        self.spent = spent
        self.cpu = self.asleep = 0.0
        self.last = time.monotonic()
        self.was_asleep = False

    def tick(self) -> bool:
        """Measure since the last tick: does the rank wait for the held reply?"""
        now = time.monotonic()
        cpu = cpu_s(self.pid)
        if cpu is not None and self.cpu0 is not None:
            self.cpu = cpu - self.cpu0
        still = self.pid is not None and asleep(self.pid, self.nice)
        if still and self.was_asleep:
            self.asleep += now - self.last
        self.was_asleep, self.last = still, now
        cpu, slept = self.total()
        return cpu >= CPU_S or slept >= ASLEEP_S

    def total(self) -> tuple[float, float]:
        """CPU s and asleep s with a reply held, in this backward so far."""
        return self.spent[0] + self.cpu, self.spent[1] + self.asleep

    def why(self) -> str:
        cpu, slept = self.total()
        return (f"in this backward it burnt {cpu:.3f} s of CPU and slept {slept:.2f} s with a "
                f"reply held and nothing sent; limits {CPU_S} s, {ASLEEP_S} s")  # fmt: skip
