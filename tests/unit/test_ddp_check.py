"""Lab 6's grader-side checks on hand-made event streams: each says what is wrong, and passes the right one."""

from __future__ import annotations

from helpers.course.grading.checks.ddp_check import message_params, order_problems, reverse_buckets

NUMELS = [55, 35, 7, 35, 5]  # TinyNet's trainable parameters, in registration order
ARRIVAL = [4, 3, 2, 1, 0]  # the order backward makes their gradients ready


def overlapped(buckets, held=True):
    """The events of a wrapper that starts each bucket's all-reduce as its last gradient is ready."""
    bucket_of = {i: b for b, members in enumerate(buckets) for i in members}
    ready, events = [0] * len(buckets), [("broadcast", n) for n in NUMELS]
    for i in ARRIVAL:
        events.append(("grad", i))
        if i == 4:
            events.append(("held", held))
        b = bucket_of[i]
        ready[b] += 1
        if ready[b] == len(buckets[b]):
            events.append(("all_reduce", sum(NUMELS[j] for j in buckets[b])))
    return events


def test_reverse_buckets_fill_up_to_the_cap_and_never_split_a_parameter():
    assert reverse_buckets(NUMELS, 8, 320) == [[4, 3], [2], [1], [0]]  # 40 + 280 = 320 exactly
    assert reverse_buckets(NUMELS, 8, 319) == [[4], [3], [2], [1], [0]]
    assert reverse_buckets(NUMELS, 8, 400) == [[4, 3, 2], [1], [0]]
    assert reverse_buckets(NUMELS, 8, 10**6) == [[4, 3, 2, 1, 0]]


def test_an_overlapping_ddp_has_no_problem():
    for cap in (8, 320, 400, 10**6):
        buckets = reverse_buckets(NUMELS, 8, cap)
        assert order_problems(overlapped(buckets), buckets, NUMELS) == []
        assert message_params(overlapped(buckets), buckets) == buckets


def test_a_late_flat_all_reduce_and_a_waiting_hook_are_named():
    per_parameter = [[i] for i in range(5)]
    late = [e for e in overlapped(per_parameter) if e[0] != "all_reduce"] + [("all_reduce", 137)]
    problems = order_problems(late, per_parameter, NUMELS)
    assert any("did not start before the next gradient" in p for p in problems), problems
    waited = order_problems(overlapped(per_parameter, held=False), per_parameter, NUMELS)
    assert len(waited) == 1 and "waited for its all-reduce" in waited[0], waited


def test_buckets_of_another_cap_are_named():
    sent = overlapped(reverse_buckets(NUMELS, 8, 400))  # a cap the lab did not ask for
    problems = order_problems(sent, reverse_buckets(NUMELS, 8, 320), NUMELS)
    assert "bucket 0 (parameters [4, 3], 40 elements) was complete but" in problems[0], problems
    assert "carried 47 elements; the bucket holds 7" in problems[1], problems


def test_a_hold_of_the_second_step_is_read_too():
    # Rank 0 holds in step 1 (rank 1 in step 0): a wrapper whose hooks wait on every rank but
    # rank 0 lets step 0's hold go and fails step 1's, which streamed_order must not drop.
    from types import SimpleNamespace

    from helpers.course.grading.checks.ddp_check import streamed_order

    events = []
    for step, ok in ((0, True), (1, False)):
        for i in ARRIVAL:
            events.append({"kind": "grad", "param": i, "step": step})
            if i == 4:
                events.append(
                    {"kind": "held", "ok": ok, "step": step, "waiting_for": [] if ok else [1]}
                )
            events.append({"kind": "op", "op": "all_reduce", "numel": NUMELS[i]})
    rec = SimpleNamespace(label="your DDP order", closed=True, events=events)
    order = streamed_order([rec], rank=0, exercise="your DDP", case=0)
    assert order.count(("held", True)) == 1 and order.count(("held", False)) == 1, order
    assert [e for e in order if e[0] == "grad"] == [("grad", i) for i in ARRIVAL]  # step 0's only
    per_parameter = [[i] for i in range(5)]
    problems = order_problems(order, per_parameter, NUMELS)
    assert len(problems) == 1 and "waited for its all-reduce" in problems[0], problems
