"""How a hand-written DDP works (lab 6's "by hand" checks), from the grading process's log.

``run_cases`` runs the learner's wrapper on real ranks under helpers.course.grading.checks.
ddp_watch (one spawn for several cases) and returns, per case, what each rank returned and
its recording: its all-reduces (with what each carried) and the gates its backward passed,
in the order they reached the grading process. The plan (what may run, the tampers, the
gates and holds) stays in the grading process; the ranks get the cases' steps and rates.

    check_broadcast(run)            every rank starts from rank 0's parameters and buffers
    check_training(run)             gradients after finish() and final weights = one process
    check_order(run, buckets)       per step: one all-reduce per bucket, each carrying its
        gradients, every bucket complete above a gate all-reduced before backward passed it,
        none after backward returned (the holds fail a hook that waits, in the rank)
    check_contents(run, buckets)    each all-reduce of step 0 carries the rank's own gradients
    check_tamper(run, buckets, rank_t, nth, delta)  a message changed in flight moves
        exactly its parameters' gradients, on every rank
    reverse_buckets(numels, itemsize, cap)  the bucket assignment the lab asks for

``run.want`` is what every rank must hold (``ddp_watch.single_process`` with the factors the
gates applied); the per-parameter DDP is checked with buckets of one parameter each.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from helpers.course.grading.checks.ddp_watch import (
    ALLOWED,
    GATES,
    TinyNet,
    above,
    single_process,
    train_watched,
)
from helpers.course.grading.recorder.events import EventLog
from helpers.course.grading.recorder.recording import Recording
from helpers.course.grading.recorder.tamper import Tamper
from helpers.launch import spawn

__all__ = [
    "Run", "TinyNet", "check_broadcast", "check_contents", "check_order", "check_tamper",
    "check_training", "order_problems", "reverse_buckets", "run_cases", "single_process",
]  # fmt: skip


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


@dataclass
class Run:
    """One case on every rank: what each returned, its recording, what it must hold."""

    world: int
    results: list[dict]
    recordings: list[Recording]
    factors: list[dict] = field(default_factory=list)  # per step: {gate: factor}
    steps: int = 1
    lr: float = 0.5

    @functools.cached_property
    def want(self) -> dict:
        return single_process(self.world, self.steps, self.lr, self.factors or None)

    def steps_of(self, rank: int) -> list[list[tuple]]:
        """Per step, the rank's (kind, value) in order: ("begin"/"g1"/"g2"/"end", None) and
        ("all_reduce", tensor it carried)."""
        out, current = [], None
        for e in self.recordings[rank].events:
            if e["kind"] == "gate" and e["name"] == "begin":
                current = []
                out.append(current)
            if current is None:
                continue
            if e["kind"] == "gate":
                current.append((e["name"], None))
            elif e["kind"] == "collective" and e["name"] == "all_reduce":
                current.append(("all_reduce", e.get("tensor")))
        return out


def _wrapped(d, wraps, cases, exercise):
    return [train_watched(d, wrap, steps, lr, exercise)
            for wrap, (steps, lr) in zip(wraps, cases, strict=True)]  # fmt: skip


def run_cases(world: int, wrap: Callable | list[Callable], cases: list[tuple], hold: bool = False,
              tampers: list | None = None, exercise: str = "your DDP") -> list[Run]:  # fmt: skip
    """Each case (steps, lr) of ``wrap`` (or of its wrap in a list, one per case) on
    ``world`` ranks, in one spawn. hold: the gates and holds (the overlap check); tampers:
    per case None or (rank, nth, delta): that rank's nth all-reduce of the case gets
    ``delta`` added on its way (the ranks are not told)."""
    wraps = wrap if isinstance(wrap, list) else [wrap] * len(cases)
    plan = [Tamper(t[0], "all_reduce", functools.partial(torch.add, other=t[2]), nth=t[1], case=i)
            for i, t in enumerate(tampers or []) if t is not None]  # fmt: skip
    with EventLog(allow=ALLOWED, content=True, tamper=plan, gates=hold) as log:
        results = spawn(_wrapped, world_size=world, args=(wraps, cases, exercise), timeout=60)
    recs = log.complete(world, len(cases), "cases")
    factors = [dict(zip(GATES, f, strict=True))
               for f in zip(*(log.factors(g) for g in GATES), strict=True)] if hold else []  # fmt: skip
    runs, done = [], 0
    for i, (steps, lr) in enumerate(cases):
        mine = factors[done : done + steps]
        done += steps
        runs.append(Run(world, [results[r][i] for r in range(world)],
                        [recs[r][i] for r in range(world)], mine, steps, lr))  # fmt: skip
    return runs


def _close(got, want, what: str) -> None:
    torch.testing.assert_close(got, want, msg=lambda m: f"{what}: {m}")


def check_broadcast(run: Run, want: dict | None = None) -> None:
    """Every rank's parameters and buffers right after wrapping are rank 0's."""
    want = want or run.want
    for rank, res in enumerate(run.results):
        _close(res["start"], want["start"], f"rank {rank} of {run.world}, parameters and buffers right "
               "after wrapping (each rank built its model from a different seed: rank 0's must reach all)")  # fmt: skip


def check_training(run: Run, want: dict | None = None) -> None:
    """Every rank's averaged gradients, step by step, and its final weights are one process's."""
    want = want or run.want
    for rank, res in enumerate(run.results):
        for step, (got, ref) in enumerate(zip(res["grads"], want["grads"], strict=True)):
            _close(got, ref, f"rank {rank} of {run.world}, gradients after finish() in step {step} "
                   "(the mean over ranks = one process on every rank's batch)")  # fmt: skip
        _close(res["final"], want["final"], f"rank {rank} of {run.world}, weights after training")


def _bucket_of(sent, local: list[torch.Tensor], buckets, world: int) -> int | None:
    """The bucket whose gradients (this rank's own, or them / N) an all-reduce carried."""
    if sent is None:
        return None
    got = sent.flatten().double().sort().values
    for b, members in enumerate(buckets):
        mine = torch.cat([local[i].flatten() for i in members]).double().sort().values
        if got.shape == mine.shape and (
            torch.allclose(got, mine) or torch.allclose(got, mine / world)
        ):
            return b
    return None


def order_problems(seq: list[tuple], buckets: list[list[int]], local, world: int) -> list[str]:
    """Why one backward's log (``Run.steps_of``) is not an overlapping DDP's ([] when it is)."""
    gates = [k for k, _ in seq if k != "all_reduce"]
    if gates != ["begin", *GATES, "end"]:
        return [f"its backward passed the test's gates as {gates}, not once each in order: "
                "the model's own forward and backward must run"]  # fmt: skip
    problems, sent, passed = [], [], []
    for kind, tensor in seq:
        if kind == "all_reduce":
            b = _bucket_of(tensor, local, buckets, world)
            if b is None:
                problems.append("an all-reduce carried something other than one bucket's gradients "
                                "(this rank's own, or them / N)")  # fmt: skip
            elif b in sent:
                problems.append(f"bucket {b} (parameters {buckets[b]}) was all-reduced twice")
            else:
                sent.append(b)
        elif kind in GATES:
            passed.append(kind)
            for b, members in enumerate(buckets):
                if set(members) <= above(kind) and b not in sent:
                    problems.append(f"bucket {b} (parameters {buckets[b]}) was complete before backward "
                                    f"reached the next layers, but its all-reduce had not started: start "
                                    "it from the hook of its last gradient, while backward goes on")  # fmt: skip
        elif kind == "end":
            missing = [b for b in range(len(buckets)) if b not in sent]
            if missing:
                problems.append(f"buckets {missing} were not all-reduced before backward returned "
                                "(one all-reduce per bucket, from its hook)")  # fmt: skip
    return problems


def _counts_problems(seq: list[tuple], buckets: list[list[int]]) -> list[str]:
    """A later step's log, by counts (its gradients are not computed here): as many
    all-reduces before each gate as buckets complete above it, one per bucket in all."""
    gates = [k for k, _ in seq if k != "all_reduce"]
    if gates != ["begin", *GATES, "end"]:
        return [f"its backward passed the test's gates as {gates}, not once each in order"]
    problems, count = [], 0
    for kind, _ in seq:
        if kind == "all_reduce":
            count += 1
        elif kind in GATES:
            due = sum(set(m) <= above(kind) for m in buckets)
            if count < due:
                problems.append(f"{count} all-reduces had started when backward reached the next "
                                f"layers, after {due} buckets were complete")  # fmt: skip
        elif kind == "end" and count != len(buckets):
            problems.append(f"{count} all-reduces during backward for {len(buckets)} buckets")
    return problems


def check_order(run: Run, buckets: list[list[int]], want: dict | None = None) -> None:
    """Per step, on every rank: the all-reduces and gates (see the module docstring)."""
    want = want or run.want
    for rank in range(run.world):
        steps = run.steps_of(rank)
        assert len(steps) == run.steps, (
            f"rank {rank} of {run.world}: {len(steps)} backward passes logged for {run.steps} steps"
        )
        for step, seq in enumerate(steps):
            if step == 0:
                problems = order_problems(seq, buckets, want["local"][rank], run.world)
            else:
                problems = _counts_problems(seq, buckets)
            assert not problems, f"rank {rank} of {run.world}, step {step}: " + "; ".join(problems)


def check_contents(run: Run, buckets: list[list[int]], want: dict | None = None) -> None:
    """Each all-reduce of step 0 carries this rank's own gradients of one bucket (or / N)."""
    want = want or run.want
    for rank in range(run.world):
        seq = run.steps_of(rank)[0] if run.steps_of(rank) else []
        sent = [t for k, t in seq if k == "all_reduce"]
        assert len(sent) == len(buckets), (
            f"rank {rank} of {run.world}: {len(sent)} all-reduces during backward for {len(buckets)} buckets"
        )
        found = [_bucket_of(t, want["local"][rank], buckets, run.world) for t in sent]
        assert sorted(b for b in found if b is not None) == list(range(len(buckets))), (
            f"rank {rank} of {run.world}: its all-reduces carried the gradients of buckets {found} "
            f"(None: of no bucket); each should carry this rank's own gradients of one bucket "
            f"{buckets} (or them / N)"
        )


def check_tamper(run: Run, buckets: list[list[int]], rank_t: int, nth: int, delta: float,
                 want: dict | None = None) -> None:  # fmt: skip
    """Rank rank_t's nth all-reduce had delta added on its way: exactly that message's
    parameters move, by delta / N (averaged after) or delta (divided before), on every rank."""
    want = want or run.want
    numels = want["numels"]
    other = (rank_t + 1) % run.world  # its nth all-reduce is the same bucket's, unchanged
    sent = [
        t for k, t in (run.steps_of(other)[0] if run.steps_of(other) else []) if k == "all_reduce"
    ]
    assert nth < len(sent), f"rank {other} issued {len(sent)} all-reduces in step 0"
    b = _bucket_of(sent[nth], want["local"][other], buckets, run.world)
    assert b is not None, f"rank {other}'s all-reduce {nth} carried no bucket's gradients"
    hit = set(buckets[b])
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
