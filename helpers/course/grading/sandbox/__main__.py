"""``python -m helpers.course.grading.sandbox``: does the sandbox work here, and what does it cost?

Starts a pool (2 rank slots and the learner slot, in parallel), then times a direct call
and a 2-rank all-reduce through the relay, several times each, and prints the median and
the worst. Exits 1 with bwrap's install hint where the machine cannot sandbox.
"""

from __future__ import annotations

import statistics
import sys
import time

from helpers.course.grading.sandbox.bwrap import SandboxUnavailable
from helpers.course.grading.sandbox.pool import SandboxPool

SOURCE = "def double(x):\n    return 2 * x\n"


def _all_reduce(d):
    import torch
    import torch.distributed as tdist

    t = torch.full((1024,), float(d.rank + 1))
    tdist.all_reduce(t)
    return t[:1]


def _timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main(repeats: int = 10) -> int:
    try:
        t = time.perf_counter()
        pool = SandboxPool(max_world=2)
        pool.start()
    except SandboxUnavailable as e:
        print(e, file=sys.stderr)
        return 1
    with pool:
        wall = time.perf_counter() - t
        slots = ", ".join(f"{s:.2f}" for s in pool.start_times())
        print(
            f"slot start-up: {wall:.2f} s for {len(pool.slots)} slots in parallel "
            f"(each, launch to ready: {slots} s)"
        )
        pool.call("double", 1, learner_source=SOURCE)  # the learner process: built once
        rows = {
            "direct call round trip": _timed(
                lambda: pool.call("double", 21, learner_source=SOURCE), repeats
            ),
            "2-rank job round trip (relay all-reduce)": _timed(
                lambda: pool.spawn(_all_reduce, 2, learner_source=SOURCE), repeats
            ),
        }
        for name, times in rows.items():
            print(
                f"{name}: median {statistics.median(times) * 1e3:.1f} ms, "
                f"worst {max(times) * 1e3:.1f} ms over {repeats}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
