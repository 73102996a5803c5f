"""helpers.course.grading.recorder.traffic on real gloo ranks: it logs p2p messages and refuses collectives.

The lab tests trust this recorder to tell a ring from a bypass, so every bypass
the labs' wrong answers try is checked here, plus a real ring and a deadlock.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as tdist

from helpers.course.grading.checks.ring_check import ring_problems, ring_send_bound
from helpers.course.grading.recorder.traffic import Message, record_traffic, spawn_p2p
from helpers.launch import RankFailure, spawn
from helpers.parallel.collectives.collectives import (
    ring_all_reduce,  # imported BEFORE recording starts
)


def ring(d, tensor):
    """A textbook ring all-reduce (reduce-scatter, then all-gather) with isend/recv."""
    n, r = d.world_size, d.rank
    chunks = torch.tensor_split(tensor.view(-1), n)

    def exchange(out, into):
        req = tdist.isend(out, (r + 1) % n) if out.numel() else None
        if into.numel():
            tdist.recv(into, (r - 1) % n)
        if req:
            req.wait()

    for s in range(n - 1):
        incoming = torch.empty_like(chunks[(r - s - 1) % n])
        exchange(chunks[(r - s) % n], incoming)
        chunks[(r - s - 1) % n].add_(incoming)
    for s in range(n - 1):
        exchange(chunks[(r + 1 - s) % n], chunks[(r - s) % n])


def all_to_all_p2p(d, tensor):
    """Correct sums, but every rank talks to every other: not a ring."""
    others = [p for p in range(d.world_size) if p != d.rank]
    reqs = [tdist.isend(tensor.clone(), p) for p in others]
    total = tensor.clone()
    for p in others:
        incoming = torch.empty_like(tensor)
        tdist.recv(incoming, p)
        total += incoming
    for q in reqs:
        q.wait()
    tensor.copy_(total)


def whole_tensor_ring(d, tensor):
    """Right neighbour only, but the whole tensor N-1 times: (N-1)n elements, not 2(N-1)/N n."""
    n, r = d.world_size, d.rank
    passing, total = tensor.clone(), tensor.clone()
    for _ in range(n - 1):
        incoming = torch.empty_like(tensor)
        req = tdist.isend(passing, (r + 1) % n)
        tdist.recv(incoming, (r - 1) % n)
        req.wait()
        total += incoming
        passing = incoming
    tensor.copy_(total)


def blocking_send_first(d, tensor):
    """The classic deadlock: every rank sends (blocking) before it receives."""
    incoming = torch.empty_like(tensor)
    tdist.send(tensor, (d.rank + 1) % d.world_size)
    tdist.recv(incoming, (d.rank - 1) % d.world_size)


def recorded(d, fn, numel, allow=()):
    """Run fn(d, tensor) under the recorder: (result, expected, traffic, ring problems)."""
    tensor = torch.arange(numel, dtype=torch.float32) + 100 * d.rank
    expected = tensor.clone()
    tdist.all_reduce(expected)  # before recording: the recorder must not be active yet
    with record_traffic(allow=allow, exercise="the test") as traffic:
        fn(d, tensor)
    return tensor, expected, traffic, ring_problems(traffic, d.rank, d.world_size, numel)


def refused(d, fn):
    """The error fn(d) raises under the recorder, as (type name, message); None if none."""
    try:
        with record_traffic(exercise="the test"):
            fn(d)
    except Exception as e:  # noqa: BLE001 - the type is the result
        return type(e).__name__, str(e)
    return None


BYPASSES = {
    "all_reduce": lambda d: tdist.all_reduce(torch.ones(4)),
    "distributed_c10d.all_reduce": lambda d: tdist.distributed_c10d.all_reduce(torch.ones(4)),
    "all_reduce_coalesced": lambda d: tdist.all_reduce_coalesced([torch.ones(4)]),
    "all_gather_object": lambda d: tdist.all_gather_object([None] * d.world_size, d.rank),
    "broadcast_object_list": lambda d: tdist.broadcast_object_list([d.rank], src=0),
    "ProcessGroup.allreduce": lambda d: tdist.group.WORLD.allreduce([torch.ones(4)]).wait(),
    "reduce_scatter_tensor": lambda d: tdist.reduce_scatter_tensor(
        torch.empty(2), torch.ones(2 * d.world_size)
    ),
    "barrier": lambda d: tdist.barrier(),
    "helpers ring_all_reduce": lambda d: ring_all_reduce(d, torch.ones(4)),
}


def try_bypasses(d):
    return {name: refused(d, fn) for name, fn in BYPASSES.items()}


def test_a_ring_sends_right_receives_left_within_the_bound():
    numel = 10  # chunks of 3, 3, 2, 2 on 4 ranks
    for rank, (got, expected, traffic, problems) in enumerate(
        spawn(recorded, world_size=4, args=(ring, numel))
    ):
        assert torch.equal(got, expected)
        assert problems == [], problems
        assert {m.peer for m in traffic.sent()} == {(rank + 1) % 4}
        assert {m.peer for m in traffic.received()} == {(rank - 1) % 4}
        assert {m.op for m in traffic.sent()} == {"isend"}
        assert {m.op for m in traffic.received()} == {"recv"}
        assert len(traffic.sent()) == 6 and traffic.collectives == []  # 2(N-1) steps
        assert traffic.bytes_sent() == 4 * traffic.elements_sent()  # float32
        assert traffic.elements_sent() <= ring_send_bound(numel, 4) == 18


def test_every_collective_path_is_refused_with_a_clear_message():
    for rank, outcome in enumerate(spawn(try_bypasses, world_size=2)):
        for name, error in outcome.items():
            assert error is not None, f"rank {rank}: {name} was not refused"
            kind, message = error
            if name.startswith("helpers"):
                assert kind == "RuntimeError" and "your own code" in message, error
            else:
                assert kind == "CollectiveRefused", (name, error)
                assert "must not call the collective" in message and "tdist.send" in message


def test_all_to_all_made_of_send_recv_is_not_a_ring():
    for got, expected, _, problems in spawn(recorded, world_size=3, args=(all_to_all_p2p, 6)):
        assert torch.equal(got, expected)  # right answer...
        assert any("only to its right-hand neighbour" in p for p in problems), problems
        assert any("only from its left-hand neighbour" in p for p in problems), problems


def test_sending_the_whole_tensor_round_the_ring_is_too_much_traffic():
    for got, expected, traffic, problems in spawn(
        recorded, world_size=3, args=(whole_tensor_ring, 9)
    ):
        assert torch.equal(got, expected) and traffic.elements_sent() == 18
        assert len(problems) == 1 and "at most 2(N-1)/N * n = 12" in problems[0], problems


def test_no_traffic_at_all_is_caught_even_if_no_collective_was_seen():
    def cheat(d, tensor):
        tensor.mul_(d.world_size)  # pretends every rank held the same tensor

    problems = spawn(recorded, world_size=2, args=(cheat, 8))[0][3]
    assert any("received only 0 elements" in p for p in problems), problems


def test_allowed_collectives_run_and_are_counted():
    def two_all_reduces(d, tensor):
        tdist.all_reduce(tensor)
        tdist.all_reduce(torch.ones(1))

    got, expected, traffic, _ = spawn(
        recorded, world_size=2, args=(two_all_reduces, 3, ("all_reduce",))
    )[0]
    assert torch.equal(got, expected) and traffic.collectives == ["all_reduce", "all_reduce"]


def test_recorder_restores_everything_afterwards():
    def after(d):
        with record_traffic():
            pass
        t = torch.ones(2)
        tdist.all_reduce(t)  # works again
        return t.tolist(), ring_all_reduce(d, torch.ones(2)).tolist(), tdist.isend.__name__

    assert spawn(after, world_size=2)[0] == ([2.0, 2.0], [2.0, 2.0], "isend")


def test_message_directions():
    assert Message("isend", 1, 3, 12).outgoing and not Message("irecv", 0, 3, 12).outgoing


@pytest.mark.slow
def test_a_deadlocked_ring_fails_within_20_s_naming_send_and_recv():
    start = time.monotonic()
    with pytest.raises(AssertionError, match="blocking tdist.send before its tdist.recv"):
        spawn_p2p(recorded, world_size=3, args=(blocking_send_first, 4), timeout=12)
    assert time.monotonic() - start < 20


def test_other_failures_are_not_called_deadlocks():
    def boom(d):
        raise ValueError("not a deadlock")

    with pytest.raises(RankFailure, match="not a deadlock"):
        spawn_p2p(boom, world_size=2)


def collective_bytes(d):
    with record_traffic(allow=("all_reduce", "all_gather", "all_gather_into_tensor")) as t:
        tdist.all_reduce(torch.ones(3, 5))  # 15 float32: 60 bytes
        parts = [torch.empty(2, dtype=torch.float64) for _ in range(d.world_size)]
        tdist.all_gather(parts, torch.ones(2, dtype=torch.float64))  # own piece: 16 bytes
        tdist.all_gather_into_tensor(torch.empty(4 * d.world_size), torch.ones(4))  # 16 bytes
    return t.calls


def test_allowed_collectives_are_logged_with_the_bytes_this_rank_put_in():
    for calls in spawn(collective_bytes, world_size=2):
        assert [(c.name, c.bytes) for c in calls] == [
            ("all_reduce", 60),
            ("all_gather", 16),
            ("all_gather_into_tensor", 16),
        ]
