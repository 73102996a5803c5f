"""NCCL's rules for the order of messages, as a model (helpers.standin.nccl_order), and lab 1's
check of a ring's recorded traffic against it (ring_check.nccl_order_problems)."""

from __future__ import annotations

import gc
from datetime import timedelta

import pytest
import torch
import torch.distributed as tdist

from helpers.course.grading.checks.ring_check import nccl_order_problems
from helpers.course.grading.recorder.traffic import Message, Traffic
from helpers.standin.nccl_explain import p2p_problems
from helpers.standin.nccl_order import Op
from helpers.standin.ordering import GroupCheck, WouldHang
from helpers.standin.work import CheckedWork


def _log(rank: int, calls) -> list[Op]:
    """calls: (api, peer, batch) in posting order; a blocking send/recv is waited for at once."""
    ops, after = [], ()
    for i, (api, peer, batch) in enumerate(calls):
        kind = "send" if api.endswith("send") else "recv"
        ops.append(Op(rank, i, kind, peer, batch, 4, "float32", api, f"p.py:{i + 1}", after))
        after = (i,) if api in ("send", "recv") else ()
    return ops


def _ring(world: int, first: str, second: str, batch: bool = False) -> list[list[Op]]:
    b = 0 if batch else None
    return [_log(r, [(first, (r + 1) % world, b), (second, (r - 1) % world, b)])
            for r in range(world)]  # fmt: skip


def test_two_ranks_each_isend_then_recv_hang_and_the_cycle_is_named():
    (problem,) = p2p_problems(_ring(2, "isend", "recv"))
    assert "so on GPUs this hangs" in problem
    for rank in (0, 1):
        assert f"rank {rank}'s isend to {1 - rank} (p.py:1) cannot complete until" in problem
        assert f"rank {rank}'s recv from {1 - rank} (p.py:2) was posted after" in problem
    assert "batch_isend_irecv" in problem and "parity" in problem


def test_what_nccl_runs_passes():
    assert p2p_problems(_ring(2, "isend", "irecv", batch=True)) == []  # one batch
    # a group made without a device: a stream per pair, and 3 ranks' two calls go to 2 pairs
    assert p2p_problems(_ring(3, "isend", "recv"), eager=False) == []
    parity = [_log(0, [("send", 1, None), ("recv", 1, None)]),
              _log(1, [("recv", 0, None), ("send", 0, None)])]  # fmt: skip
    assert p2p_problems(parity) == []


def test_what_nccl_hangs_on_fails():
    assert p2p_problems(_ring(2, "isend", "irecv"))  # unbatched, even with both non-blocking
    # bound to a device (helpers.dist.init): one stream per group, and the ring hangs on 3
    assert "on the group's one stream" in p2p_problems(_ring(3, "isend", "recv"))[0]
    blocking = p2p_problems(_ring(3, "send", "recv"))  # every rank's recv waits for its send
    assert (
        blocking
        and "rank 1's recv from 0 (p.py:2) was posted after rank 1's send to 2" in blocking[0]
    )
    mixed = [
        _log(0, [("isend", 1, 0), ("irecv", 1, 0)]),
        _log(1, [("isend", 0, None), ("recv", 0, None)]),
    ]
    assert "matches a batch's operations only with batched ones" in p2p_problems(mixed)[0]


def test_a_message_of_another_size_and_a_collective_of_another_shape_are_named():
    sizes = _ring(2, "isend", "irecv", batch=True)
    sizes[1][1] = Op(1, 1, "recv", 0, 0, 8, "float32", "irecv", "p.py:2")
    assert (
        "sends 4 float32" in p2p_problems(sizes)[0]
        and "receives 8 float32" in p2p_problems(sizes)[0]
    )
    colls = [[Op(r, 0, "coll", name="all_reduce", at="p.py:5", sig=f"all_reduce([float32[{4 + 4 * r}]])")]
             for r in (0, 1)]  # fmt: skip
    (problem,) = p2p_problems(colls)
    assert "collective #1 of this group differs" in problem
    assert "float32[4]" in problem and "float32[8]" in problem


def _traffic(*calls) -> Traffic:
    return Traffic(messages=[Message(api, peer, 4, 16) for api, peer in calls])


def test_lab_1s_check_refuses_the_unsafe_ring_and_accepts_the_safe_ones():
    unsafe = [_traffic(("isend", 1), ("recv", 1)), _traffic(("isend", 0), ("recv", 0))]
    (problem,) = nccl_order_problems(unsafe)
    assert "rank 0's isend to 1 (its message #1) cannot complete until rank 1's recv" in problem
    assert nccl_order_problems([_traffic(("isend", (r + 1) % 3), ("recv", (r - 1) % 3))
                                for r in range(3)])  # fmt: skip
    batched = [_traffic(("isend", 1), ("irecv", 1)), _traffic(("isend", 0), ("irecv", 0))]
    parity = [_traffic(("send", 1), ("recv", 1)), _traffic(("recv", 0), ("send", 0))]
    parity3 = [_traffic(("send", 1), ("recv", 2)), _traffic(("recv", 0), ("send", 2)),
               _traffic(("send", 0), ("recv", 1))]  # fmt: skip
    assert nccl_order_problems(batched) == nccl_order_problems(parity) == []
    assert nccl_order_problems(parity3) == []


class _GlooWork:
    """What gloo's own operation did, once the check could no longer ask the store."""

    def __init__(self, error: str | None):
        self.error = error

    def wait(self, timeout=None):
        if self.error:
            raise RuntimeError(self.error)
        return True


def test_a_rank_whose_store_host_ended_leaves_the_verdict_to_gloos_operation():
    """Rank 0 hosts the group's store and may end as soon as its last wait is done, before
    rank 1 has read that its own wait is done too: rank 1 then cannot ask the model. Its wait
    completes when gloo's operation does (the peer had matched it) and fails with a clear
    WouldHang, not the store's connection error, when gloo's fails too."""
    host = tdist.TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False)
    store = tdist.TCPStore("127.0.0.1", host.port, 2, False, timeout=timedelta(seconds=10))
    check = GroupCheck(store, 1, 2, timeout_s=10.0)
    index = check.post("recv", 0, [torch.zeros(4)], "recv")
    del host  # its server stops: rank 0's program ended
    gc.collect()
    assert CheckedWork(_GlooWork(None), check, index).wait() is True
    with pytest.raises(WouldHang) as failed:
        CheckedWork(_GlooWork("Connection closed by peer"), check, index).wait()
    message = str(failed.value)
    assert "the group's store is gone (" in message, message
    assert "rank 1's recv from 0" in message and "matching send" in message, message
