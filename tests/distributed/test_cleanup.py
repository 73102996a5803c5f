"""dist.cleanup(): every rank waits for the others on a normal exit, never on a failing one.

Without the wait, tearing gloo down while a peer is still talking aborted a rank
("terminate called without an active exception") in about one run in eight of
the 2-rank DDP program; with it, none in 32.
"""

from __future__ import annotations

import time

from helpers import dist, launch


def _timed_cleanup(d, late_rank_sleep: float, failing: bool):
    if d.rank == 1:
        time.sleep(late_rank_sleep)  # rank 1 arrives late
    start = time.perf_counter()
    if failing:
        try:
            try:
                raise ValueError("a failing rank")
            finally:
                dist.cleanup()  # called while the exception is on its way out
        except ValueError:
            pass
    else:
        dist.cleanup()
    return time.perf_counter() - start


def test_cleanup_waits_for_every_rank_on_a_normal_exit():
    waited = launch.spawn(_timed_cleanup, world_size=2, args=(1.5, False))
    assert waited[0] >= 1.0, f"rank 0 left after {waited[0]:.2f} s without waiting for rank 1"
    assert not dist.is_initialized()


def test_cleanup_does_not_wait_while_an_exception_propagates():
    waited = launch.spawn(_timed_cleanup, world_size=2, args=(1.5, True))
    assert waited[0] < 1.0, f"a failing rank waited {waited[0]:.2f} s in cleanup()"
