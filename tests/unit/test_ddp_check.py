"""Lab 6's grader-side checks on hand-made logs: each says what is wrong, and passes the right one.

A log is what the grading process saw of one backward on one rank, in order: the gates its
backward passed ("begin", g1, g2, "end") and each all-reduce with what it carried. The
buckets are identified by their contents (this rank's own gradients), never by anything
the rank says.
"""

from __future__ import annotations

import torch

from helpers.course.grading.checks.ddp_check import order_problems, reverse_buckets
from helpers.course.grading.checks.ddp_watch import GATES, above

NUMELS = [55, 35, 7, 35, 5]  # TinyNet's trainable parameters, in registration order
ARRIVAL = [4, 3, 2, 1, 0]  # the order backward makes their gradients ready
LOCAL = [torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
         for i, n in enumerate(NUMELS)]  # fmt: skip


def carried(members):
    return torch.cat([LOCAL[i] for i in members])


def overlapped(buckets):
    """The log of a wrapper that starts each bucket's all-reduce as its last gradient is ready."""
    bucket_of = {i: b for b, members in enumerate(buckets) for i in members}
    ready, seq = [0] * len(buckets), [("begin", None)]
    passed = set()
    for i in ARRIVAL:
        for gate in GATES:  # backward reaches a gate once the parameters above it are done
            if gate not in passed and above(gate) <= set(ARRIVAL[: ARRIVAL.index(i)]):
                seq.append((gate, None))
                passed.add(gate)
        b = bucket_of[i]
        ready[b] += 1
        if ready[b] == len(buckets[b]):
            seq.append(("all_reduce", carried(buckets[b])))
    return [*seq, ("end", None)]


def test_reverse_buckets_fill_up_to_the_cap_and_never_split_a_parameter():
    assert reverse_buckets(NUMELS, 8, 320) == [[4, 3], [2], [1], [0]]  # 40 + 280 = 320 exactly
    assert reverse_buckets(NUMELS, 8, 319) == [[4], [3], [2], [1], [0]]
    assert reverse_buckets(NUMELS, 8, 400) == [[4, 3, 2], [1], [0]]
    assert reverse_buckets(NUMELS, 8, 10**6) == [[4, 3, 2, 1, 0]]


def test_an_overlapping_ddp_has_no_problem():
    for cap in (8, 320, 400, 10**6):
        buckets = reverse_buckets(NUMELS, 8, cap)
        seq = overlapped(buckets)
        assert [k for k, _ in seq if k != "all_reduce"] == ["begin", "g1", "g2", "end"]
        assert order_problems(seq, buckets, LOCAL, 2) == []
        averaged = [(k, t / 2 if t is not None else t) for k, t in seq]  # divided before: fine
        assert order_problems(averaged, buckets, LOCAL, 2) == []


def test_all_reduces_after_backward_are_named():
    per_parameter = [[i] for i in range(5)]
    late = [e for e in overlapped(per_parameter) if e[0] != "all_reduce"]
    late += [("all_reduce", carried([i])) for i in ARRIVAL]  # in finish(), after "end"
    problems = order_problems(late, per_parameter, LOCAL, 2)
    assert any("its all-reduce had not started" in p for p in problems), problems
    assert any("were not all-reduced before backward returned" in p for p in problems), problems


def test_buckets_of_another_cap_and_wrong_contents_are_named():
    sent = overlapped(reverse_buckets(NUMELS, 8, 400))  # a cap the lab did not ask for
    problems = order_problems(sent, reverse_buckets(NUMELS, 8, 320), LOCAL, 2)
    assert any("other than one bucket's gradients" in p for p in problems), problems
    zeros = [
        (k, torch.zeros_like(t) if t is not None else t)
        for k, t in overlapped([[i] for i in range(5)])
    ]
    problems = order_problems(zeros, [[i] for i in range(5)], LOCAL, 2)
    assert len(problems) >= 5 and "other than one bucket's gradients" in problems[0], problems


def test_a_backward_that_skipped_a_gate_is_named():
    seq = [e for e in overlapped([[i] for i in range(5)]) if e[0] != "g2"]
    problems = order_problems(seq, [[i] for i in range(5)], LOCAL, 2)
    assert len(problems) == 1 and "passed the test's gates as ['begin', 'g1', 'end']" in problems[0]
