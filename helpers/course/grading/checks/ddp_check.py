"""How a hand-written DDP works (lab 6's "by hand" checks), from what its ranks streamed.

``run_cases`` runs the learner's wrapper on real ranks under helpers.course.grading.checks.ddp_watch (one
spawn for several cases) and returns, per case, what each rank returned, its events of the
first step in the order they happened, and what its all-reduces carried. The checks:

    check_broadcast(run, want)   every rank starts from rank 0's parameters and buffers
    check_training(run, want)    gradients after finish() and final weights = one process
    check_order(run, buckets, numels)   each bucket's all-reduce issued right after its last
        gradient is ready, one per bucket, with its size; no hook waited for the other ranks
    check_contents(run, want, buckets)  each all-reduce carries the rank's own gradients
    check_tamper(run, want, buckets, rank_t, nth, delta)  a message changed in flight moves
        exactly its parameters' gradients, on every rank
    reverse_buckets(numels, itemsize, cap)  the bucket assignment the lab asks for

``want`` is ``helpers.course.grading.checks.ddp_watch.single_process(world, steps, lr)``; the per-parameter
DDP is checked with buckets of one parameter each.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import torch

from helpers.course.grading.checks.ddp_watch import HOLD_S, TinyNet, single_process, train_watched
from helpers.course.grading.recorder.events import EventLog
from helpers.launch import spawn

__all__ = [
    "HOLD_S",
    "Run",
    "TinyNet",
    "check_broadcast",
    "check_contents",
    "check_order",
    "check_tamper",
    "check_training",
    "order_problems",
    "reverse_buckets",
    "run_cases",
    "single_process",
]


def streamed_order(recs: list, rank: int, exercise: str, case: int) -> list[tuple]:
    """Rank's events of step 0 in the order they happened, as streamed to this process, and
    its holds of every step (("held", ok): rank 1 holds in step 0, rank 0 in step 1)."""
    recs = [r for r in recs if r.label == f"{exercise} order"][case : case + 1]
    if len(recs) != 1 or not recs[0].closed:
        raise AssertionError(f"rank {rank}: the order of its gradients and all-reduces was not "
                             "reported: the recording was switched off")  # fmt: skip
    seen, step = [], 0
    for e in recs[0].events:
        if e["kind"] == "grad":
            step = e["step"]
        if e["kind"] == "held":
            seen.append(("held", e["ok"]))
        elif step > 0:
            continue
        elif e["kind"] == "grad":
            seen.append(("grad", e["param"]))
        elif e["kind"] == "op" or (e["kind"] == "collective" and e.get("allowed", True)):
            seen.append((e["op"], e["numel"]))  # "op": the rank's stream; "collective": the relay's
    return seen


def reverse_buckets(numels: list[int], itemsize: int, cap: int) -> list[list[int]]:
    """Parameter indices per bucket: walk them in reverse, start a new bucket when the next
    one would bring the bucket over ``cap`` bytes (a larger one gets a bucket to itself)."""
    buckets, size = [], 0
    for i in reversed(range(len(numels))):
        nbytes = numels[i] * itemsize
        if buckets and size + nbytes <= cap:
            buckets[-1].append(i)
            size += nbytes
        else:
            buckets.append([i])
            size = nbytes
    return buckets


def order_problems(order: list[tuple], buckets: list[list[int]], numels: list[int]) -> list[str]:
    """Why these events of one backward are not an overlapping DDP's ([] when they are).

    Each bucket (one parameter each for the per-parameter DDP) must have its all-reduce
    issued right after its last gradient became ready, before the next gradient, carrying
    the bucket's elements; no other all-reduce; every hold (this rank holding back its first
    gradient until every other rank's backward has returned) released in time.
    """
    problems = []
    if ("held", False) in order:
        problems.append(
            "while this rank held back its first gradient (rank 1 does in step 0, rank 0 in "
            "step 1), another rank's backward() did not return: a hook waited for its "
            "all-reduce (which needs every rank, the held one too). On every rank, start it "
            "with async_op=True, keep the work, and wait for it in finish()"
        )
    bucket_of = {i: b for b, members in enumerate(buckets) for i in members}
    ready = [0] * len(buckets)
    steps = [e for e in order if e[0] in ("grad", "all_reduce")]
    k = 0
    while k < len(steps):
        kind, value = steps[k]
        if kind == "all_reduce":
            problems.append(f"an all-reduce of {value} elements was issued when no bucket had just "
                            "become complete (each starts right after its last gradient is ready)")  # fmt: skip
            k += 1
            continue
        b = bucket_of.get(value)
        if b is None:
            k += 1
            continue
        ready[b] += 1
        if ready[b] == len(buckets[b]):
            want = sum(numels[i] for i in buckets[b])
            nxt = steps[k + 1] if k + 1 < len(steps) else None
            if nxt is None or nxt[0] != "all_reduce":
                problems.append(f"bucket {b} (parameters {buckets[b]}, {want} elements) was complete "
                                "but its all-reduce did not start before the next gradient")  # fmt: skip
            elif nxt[1] != want:
                problems.append(f"the all-reduce that followed bucket {b}'s last gradient carried "
                                f"{nxt[1]} elements; the bucket holds {want}")  # fmt: skip
                k += 1
            else:
                k += 1
        k += 1
    if not any(e[0] == "grad" for e in order):
        problems.append("no gradient became ready in step 0")
    return problems


def _on_ranks(d, wraps, cases, folder, exercise, hold):
    """Every case (steps, lr, tamper) on this rank, each its own recording and hold flag.
    Once a hold has waited in vain, the later cases do not hold (the first one fails)."""
    out = []
    for i, (wrap, (steps, lr, tamper)) in enumerate(zip(wraps, cases, strict=True)):
        flags = os.path.join(folder, f"done-{i}") if hold else None
        out.append(train_watched(d, wrap, steps, lr, flags, tamper, exercise))
        hold = hold and out[-1]["held_ok"]
    return out


@dataclass
class Run:
    """One case on every rank: what each returned, its step-0 events, its all-reduces' contents."""

    world: int
    results: list[dict]
    orders: list[list[tuple]]
    sent: list[list[torch.Tensor]]


def run_cases(
    world: int,
    wrap: Callable | list[Callable],
    cases: list[tuple],
    hold: bool = False,
    exercise: str = "your DDP",
) -> list[Run]:
    """Each case (steps, lr, tamper or None) of ``wrap`` (or of its wrap in a list, one per
    case) on ``world`` ranks, in one spawn. hold: in step 0 rank 1, in step 1 rank 0, holds its
    first gradient hook until every other rank's backward has returned (the overlap check, on
    every rank when a case has 2 steps; a waiting hook costs HOLD_S)."""
    wraps = wrap if isinstance(wrap, list) else [wrap] * len(cases)
    with EventLog() as log, tempfile.TemporaryDirectory(prefix="lab6-") as folder:
        args = (wraps, cases, folder, exercise, hold)
        results = spawn(_on_ranks, world_size=world, args=args, timeout=60)
    runs = []
    for i in range(len(cases)):
        orders, sent = [], []
        for rank in range(world):
            recs = log.recordings(rank)
            mine = [r for r in recs if r.label == exercise]
            if len(mine) != len(cases) or not all(r.closed for r in mine):
                raise AssertionError(f"rank {rank}: its traffic recorder reported {len(mine)} complete "
                                     f"recordings of {len(cases)}: it was switched off")  # fmt: skip
            orders.append(streamed_order(recs, rank, exercise, i))
            n = sum(1 for e in orders[-1] if e[0] == "all_reduce")
            picked = [
                e for e in mine[i].of("collective") if e["name"] == "all_reduce" and "tensor" in e
            ]
            sent.append([e["tensor"] for e in picked[:n]])
        runs.append(Run(world, [results[r][i] for r in range(world)], orders, sent))
    return runs


def _close(got, want, what: str) -> None:
    torch.testing.assert_close(got, want, msg=lambda m: f"{what}: {m}")


def check_broadcast(run: Run, want: dict) -> None:
    """Every rank's parameters and buffers right after wrapping are rank 0's."""
    for rank, res in enumerate(run.results):
        _close(res["start"], want["start"], f"rank {rank} of {run.world}, parameters and buffers right "
               "after wrapping (each rank built its model from a different seed: rank 0's must reach all)")  # fmt: skip


def check_training(run: Run, want: dict) -> None:
    """Every rank's averaged gradients, step by step, and its final weights are one process's."""
    for rank, res in enumerate(run.results):
        for step, (got, ref) in enumerate(zip(res["grads"], want["grads"], strict=True)):
            _close(got, ref, f"rank {rank} of {run.world}, gradients after finish() in step {step} "
                   "(the mean over ranks = one process on every rank's batch)")  # fmt: skip
        _close(res["final"], want["final"], f"rank {rank} of {run.world}, weights after training")


def check_order(run: Run, buckets: list[list[int]], numels: list[int]) -> None:
    for rank, order in enumerate(run.orders):
        problems = order_problems(order, buckets, numels)
        assert not problems, f"rank {rank} of {run.world}: " + "; ".join(problems)


def message_params(order: list[tuple], buckets: list[list[int]]) -> list[list[int]]:
    """The parameters of each bucket, in the order the buckets became complete."""
    bucket_of = {i: b for b, members in enumerate(buckets) for i in members}
    ready, done = [0] * len(buckets), []
    for kind, value in order:
        if kind == "grad" and value in bucket_of:
            b = bucket_of[value]
            ready[b] += 1
            if ready[b] == len(buckets[b]):
                done.append(buckets[b])
    return done


def check_contents(run: Run, want: dict, buckets: list[list[int]]) -> None:
    """Each all-reduce carries this rank's own gradients of its bucket (or them / N)."""
    for rank, (order, sent) in enumerate(zip(run.orders, run.sent, strict=True)):
        for k, members in enumerate(message_params(order, buckets)):
            mine = torch.cat([want["local"][rank][i].flatten() for i in members]).sort().values
            assert k < len(sent), f"rank {rank}: {len(sent)} all-reduces for {k + 1}+ buckets"
            got = sent[k].flatten().to(mine.dtype).sort().values
            ok = got.shape == mine.shape and (
                torch.allclose(got, mine) or torch.allclose(got, mine / run.world)
            )
            assert ok, (f"rank {rank} of {run.world}, all-reduce {k}: it should carry this rank's own "
                        f"gradients of parameters {members} ({mine.numel()} numbers, or them / N); "
                        f"it carried {got.numel()} other numbers")  # fmt: skip


def check_tamper(
    run: Run, want: dict, buckets: list[list[int]], rank_t: int, nth: int, delta: float
) -> None:
    """Rank rank_t's nth all-reduce had delta added on its way: exactly that message's
    parameters move, by delta / N (averaged after) or delta (divided before), on every rank."""
    numels = want["numels"]
    params = message_params(run.orders[rank_t], buckets)
    assert nth < len(params), f"rank {rank_t} issued {len(params)} all-reduces in step 0"
    hit = set(params[nth])
    for rank, res in enumerate(run.results):
        diff = (res["grads"][0] - want["grads"][0]).split(numels)
        moved = {i for i, d in enumerate(diff) if d.abs().max() > 1e-9}
        where = f"rank {rank} of {run.world}, rank {rank_t}'s all-reduce {nth} changed on its way (+{delta})"
        assert moved == hit, (f"{where}: the gradients of parameters {sorted(hit)} should change, "
                              f"and only they; these changed: {sorted(moved)}")  # fmt: skip
        shift = torch.cat([diff[i].flatten() for i in sorted(hit)])
        ok = torch.allclose(shift, torch.full_like(shift, delta / run.world)) or torch.allclose(
            shift, torch.full_like(shift, delta)
        )
        assert ok, (
            f"{where}: each should move by {delta / run.world:g}, it moved by {shift.tolist()}"
        )
