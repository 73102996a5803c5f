"""torch.distributed.pipelining on real gloo ranks: loss and gradients equal the serial model;
saved activations and messages measured per stage."""

import pytest
import torch

from helpers import launch
from helpers.parallel.pipeline import pipeline as PP

WIDTH, ROWS = 32, 16


def _data(seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(ROWS, WIDTH, generator=g, dtype=torch.float64)
    return x, torch.randn(ROWS, WIDTH, generator=g, dtype=torch.float64)


def _model(depth: int):
    return PP.mlp(WIDTH, depth, seed=3, dtype=torch.float64)  # float64: rounding ~1e-16


def _pipelined(d, schedule, m, v, depth, seed):
    x, y = _data(seed)
    torch.set_num_threads(1)
    return PP.run_schedule(d, _model(depth), x, y, schedule, m, v, steps=2)


def _check(per_rank, depth, seed, m, v):
    x, y = _data(seed)
    ref = PP.serial_reference(_model(depth), x, y)
    grads = {}
    for out in per_rank:
        assert not set(grads) & set(out["grads"]), "two ranks own the same layer"
        grads.update(out["grads"])
    assert sorted(grads) == sorted(ref["grads"]), "some layer has no rank"
    torch.testing.assert_close(grads, ref["grads"], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(per_rank[-1]["loss"], ref["loss"], rtol=1e-10, atol=1e-12)
    assert all(o["loss"] is None for o in per_rank[:-1])
    for out in per_rank:  # every rank ran m forwards and m backwards per chunk it holds
        kinds = [e.kind for e in out["events"]]
        assert kinds.count("F") == kinds.count("B") == m * v
        assert kinds.count("W") in (0, m * v)  # zero bubble: a weight gradient per backward


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1),
                                        ("interleaved-zb", 2)])  # fmt: skip
def test_two_ranks_equal_serial(schedule, v):
    per_rank = launch.spawn(_pipelined, 2, args=(schedule, 4, v, 4, 11))
    _check(per_rank, 4, 11, 4, v)


def test_four_ranks_one_f_one_b_equals_serial():
    per_rank = launch.spawn(_pipelined, 4, args=("1f1b", 8, 1, 4, 12))
    _check(per_rank, 4, 12, 8, 1)


def _hybrid(d, seed):
    x, y = _data(seed)
    torch.set_num_threads(1)
    return PP.run_hybrid(d, _model(4), x, y, m=2)


def test_dp_times_pp_on_a_mesh_equals_serial():
    per_rank = launch.spawn(_hybrid, 4, args=(13,))
    # pp outermost: a pipeline is ranks r and r+2; the copies of a stage are neighbours
    assert [o["groups"] for o in per_rank] == [
        {"pp": [0, 2], "dp": [0, 1]}, {"pp": [1, 3], "dp": [0, 1]},
        {"pp": [0, 2], "dp": [2, 3]}, {"pp": [1, 3], "dp": [2, 3]},
    ]  # fmt: skip
    assert per_rank[0]["rows"] == {"replica": ROWS // 2, "micro-batch": ROWS // 2 // 2}
    x, y = _data(13)
    ref = PP.serial_reference(_model(4), x, y)
    for out in per_rank:  # both replicas of a stage hold the full-batch gradient
        for name, g in out["grads"].items():
            torch.testing.assert_close(g, ref["grads"][name], rtol=1e-10, atol=1e-12)
    assert sorted({n for o in per_rank for n in o["grads"]}) == sorted(ref["grads"])


def _memory(d, schedule, v):
    torch.set_num_threads(1)
    x, y = _data(5)
    return PP.run_schedule(d, _model(16), x, y, schedule, 4, v)


def _replay(order, held, freed_by_b):
    """Peak tensors a rank holds, replaying its op order: a forward adds the tensors its
    chunk saves; a backward frees them all, or (zero bubble) all but the layer inputs,
    which the weight gradient W frees."""
    live = peak = 0
    for op in order:
        if op.kind == "F":
            live += held[op.chunk]
        elif op.kind == "B":
            live -= freed_by_b[op.chunk]
        else:
            live -= held[op.chunk] - freed_by_b[op.chunk]
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize(
    "schedule,v", [("gpipe", 1), ("1f1b", 1), ("zb-h1", 1), ("interleaved", 2)]
)
def test_saved_activations_follow_the_schedule(schedule, v):
    # 16 x (Linear, Tanh) on 4 ranks, micro-batches of ROWS/4 rows. A chunk of k layers saves,
    # per micro-batch in flight, the output of each Tanh (= the next Linear's input) and its
    # received input: k + 1 tensors, k on model stage 0 (its input is a slice of the batch,
    # not counted). After B, zero bubble keeps the Linears' inputs (k) for W.
    from helpers.parallel.pipeline import schedules as S

    per_rank = launch.spawn(_memory, 4, args=(schedule, v))
    tensor = ROWS // 4 * WIDTH * 8  # bytes of one float64 activation of a micro-batch
    k = 16 // (4 * v)  # layers per chunk
    for rank, (o, order) in enumerate(zip(per_rank, S.orders(schedule, 4, 4, v), strict=True)):
        held = [k + (rank + c > 0) for c in range(v)]  # chunk c is model stage c * 4 + rank
        freed_by_b = [1 if "zb" in schedule else h for h in held]
        assert o["saved"] == _replay(order, held, freed_by_b) * tensor, (rank, o["saved"] / tensor)
        assert o["saved_trace"][-1][1] == 0  # every saved tensor freed by the end of the step
    saved = [o["saved"] / tensor for o in per_rank]
    one_f_one_b = [4 * k, 3 * (k + 1), 2 * (k + 1), k + 1]  # p - s micro-batches in flight
    if schedule == "1f1b":  # stage 0 holds the most
        assert saved == one_f_one_b and saved[0] == max(saved)
    if schedule == "zb-h1":  # W held back downstream: later stages hold more than in 1F1B
        assert saved[0] == one_f_one_b[0] and all(
            z > o for z, o in zip(saved[1:], one_f_one_b[1:], strict=True)
        )


def test_each_boundary_carries_one_activation_and_one_gradient_per_micro_batch():
    per_rank = launch.spawn(_memory, 4, args=("1f1b", 1))
    tensor = ROWS // 4 * WIDTH * 8
    for rank, o in enumerate(per_rank):
        sent = sorted((direction, mb) for direction, mb, size in o["sent"] if size == tensor)
        assert len(sent) == len(o["sent"])  # every message is one micro-batch's tensor
        want = [("activations", mb) for mb in range(4)] * (rank < 3)
        want += [("gradients", mb) for mb in range(4)] * (rank > 0)
        assert sent == sorted(want)
