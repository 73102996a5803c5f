"""spawn(): run a notebook-defined function on N gloo ranks from the warm pool."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence

from helpers.launch.pool import get_pool
from helpers.launch.torchrun import check_nproc, threads_per_rank

__all__ = ["routed", "spawn", "warm_up"]

# Where spawn() sends its ranks instead of the warm pool: the grader pushes its sandboxed
# pool here (helpers.course.grading.grader), so the lab's own test code, unchanged, starts
# its ranks in the sandbox. Empty everywhere else.
_ROUTES: list[Callable] = []


@contextlib.contextmanager
def routed(to: Callable) -> Iterator[None]:
    """Within the block, spawn(fn, world_size, args, timeout) calls ``to`` with those
    four values, and warm_up() does nothing."""
    _ROUTES.append(to)
    try:
        yield
    finally:
        _ROUTES.remove(to)


def sandboxed() -> bool:
    """True inside the grader's sandbox (helpers.course.grading.sandbox sets the variable)."""
    return os.environ.get("WORKBOOK_SANDBOX") == "1"


def warm_up(wait: bool = True) -> None:
    """Start spawn()'s pool now, so the first spawn() does not pay for importing torch.

    ``wait=False`` starts it in the background and returns at once (labs call it
    in their first cell, so the import overlaps with the learner's cells).
    """
    if _ROUTES or sandboxed():
        return
    get_pool().start(wait=wait)


def spawn(
    fn: Callable,
    world_size: int = 4,
    args: Sequence = (),
    timeout: float = 120,
    backend: str = "gloo",
    threads: int | None = None,
) -> list:
    """Run ``fn(d, *args)`` on ``world_size`` ranks and return their values, index = rank.

    fn may be defined in the notebook (even a lambda or a closure): it is sent by
    value. ``d`` is the helpers.dist.Dist each rank gets from helpers.dist.init().
    Output printed by a rank appears here prefixed with ``[rankN]``. If a rank
    raises, the others are stopped and RankFailure names the rank and shows its
    traceback. After ``timeout`` seconds every rank is stopped.
    """
    if _ROUTES:
        return _ROUTES[-1](fn, world_size, tuple(args), timeout)
    if sandboxed():
        raise RuntimeError(
            "spawn() starts no ranks inside the grading sandbox: there the grader starts "
            "the ranks each test needs, and a rank cannot start more"
        )
    import cloudpickle

    if not callable(fn):
        raise TypeError(f"spawn needs a function fn(d, *args), got {fn!r}")
    check_nproc(world_size, "world_size")
    try:
        payload = cloudpickle.dumps((fn, tuple(args)))
    except Exception as e:
        raise TypeError(
            f"spawn could not send {getattr(fn, '__name__', fn)!r} and its args to the ranks: {e}. "
            "Pass plain values (numbers, tensors, lists) and define the function in the notebook."
        ) from e
    return get_pool().run(
        payload,
        world_size,
        threads=threads or threads_per_rank(world_size),
        backend=backend,
        timeout=timeout,
    )
