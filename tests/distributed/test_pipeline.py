"""torch.distributed.pipelining on real gloo ranks: loss and gradients equal the serial model."""

import pytest
import torch

from helpers import launch
from helpers.parallel import pipeline as PP

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


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
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
    x, y = _data(13)
    ref = PP.serial_reference(_model(4), x, y)
    for out in per_rank:  # both replicas of a stage hold the full-batch gradient
        for name, g in out["grads"].items():
            torch.testing.assert_close(g, ref["grads"][name], rtol=1e-10, atol=1e-12)
    assert sorted({n for o in per_rank for n in o["grads"]}) == sorted(ref["grads"])
