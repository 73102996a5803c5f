"""A full-size job's order of operations, checked against NCCL's rules from the ranks it ran.

A dry run plays one rank alone (rank 0, and the last rank when they send messages), so it
never sees the other ranks' operations. It checks what it can (``helpers.standin.nccl_order``):

* a job of 2 ranks: both ran, so their logs are the whole job's;
* a job whose ranks all do the same thing relative to their own rank (a ring: send to
  ``rank + 1``, receive from ``rank - 1``): when the last rank's operations, seen from its own
  rank, are rank 0's, every rank's are; the model then runs on all of them at the job's size;
* anything else (a pipeline of more than 2 stages, whose middle stages differ): only the
  device-strict run on 2 ranks checks its order.
"""

from __future__ import annotations

from helpers.standin.nccl_explain import p2p_problems
from helpers.standin.nccl_order import Op

__all__ = ["order_problem"]

_MOST = 2000  # operations per rank the model is run on (a check of the pattern, not a replay)


def _ops(result: dict) -> list[Op]:
    return [Op(**{**o, "after": tuple(o["after"])}) for o in result.get("ops", [])[:_MOST]]


def _relative(ops: list[Op], rank: int, world: int) -> list[tuple]:
    return [(o.kind, (o.peer - rank) % world if o.peer >= 0 else -1, o.batch is None, o.name,
             o.after) for o in ops]  # fmt: skip


def _as_rank(ops: list[Op], rank: int, world: int) -> list[Op]:
    """Rank 0's operations as rank ``rank`` posts them in a job where every rank does the same."""
    return [Op(rank, o.index, o.kind, (o.peer + rank) % world if o.peer >= 0 else -1, o.batch,
               o.numel, o.dtype, o.name, o.at, o.after, o.sig) for o in ops]  # fmt: skip


def order_problem(world: int, results: list[dict]) -> str | None:
    """Why NCCL would hang on this job, as far as the ranks the dry run ran show; or None."""
    logs = {r["rank"]: _ops(r) for r in results if r.get("ops")}
    if 0 not in logs or world < 2:
        return None
    if world == 2 and set(logs) == {0, 1}:
        problems = p2p_problems([logs[0], logs[1]])
    elif world - 1 in logs and _relative(logs[world - 1], world - 1, world) == _relative(
        logs[0], 0, world
    ):
        problems = p2p_problems([_as_rank(logs[0], r, world) for r in range(world)])
    else:
        return None
    return problems[0] if problems else None
