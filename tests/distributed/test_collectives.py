"""Hand-made all-reduces equal torch.distributed.all_reduce on real gloo ranks."""

import pytest
import torch
import torch.distributed as tdist

from helpers import launch
from helpers.parallel.collectives import collectives


def _compare_all(d, sizes):
    """On each rank: (size, ring, ps, builtin, ring kept input?) for each size."""
    out = []
    for n in sizes:
        x = torch.randn(n, generator=torch.Generator().manual_seed(100 * d.rank + n))
        expected = x.clone()
        tdist.all_reduce(expected)
        ring = collectives.ring_all_reduce(d, x, inplace=False)
        ps = collectives.ps_all_reduce(d, x.clone())
        kept = torch.equal(
            x, torch.randn(n, generator=torch.Generator().manual_seed(100 * d.rank + n))
        )
        out.append((n, ring, ps, expected, kept))
    return out


def _shapes_and_average(d):
    """A 2-D non-contiguous tensor reduced in place, and the averaging option."""
    base = torch.arange(15.0).reshape(3, 5) * (d.rank + 1)
    t = base.t()  # (5, 3) non-contiguous view
    expected = t.clone()
    tdist.all_reduce(expected)
    same = collectives.ring_all_reduce(d, t)  # in place
    avg = collectives.ring_all_reduce(d, torch.full((7,), float(d.rank)), average=True)
    return same is t, t.clone(), expected, avg


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_and_ps_equal_builtin_all_reduce(world):
    # sizes not divisible by the world size, smaller than it, and 1 element
    sizes = sorted({1, world - 1, world + 1, 7 * world + 3, 10_001, 262_147} - {0})
    per_rank = launch.spawn(_compare_all, world_size=world, args=(sizes,), timeout=300)
    for rank, rows in enumerate(per_rank):
        for n, ring, ps, expected, kept in rows:
            assert ring.shape == (n,)
            torch.testing.assert_close(ring, expected, msg=f"ring, rank {rank}, {n} elements")
            torch.testing.assert_close(ps, expected, msg=f"ps, rank {rank}, {n} elements")
            assert kept, f"inplace=False changed the input (rank {rank}, {n} elements)"
    # every rank ends with the same numbers
    for r in range(1, world):
        for a, b in zip(per_rank[0], per_rank[r], strict=True):
            torch.testing.assert_close(a[1], b[1], rtol=0, atol=0)


def test_ring_in_place_on_non_contiguous_tensor_and_average():
    per_rank = launch.spawn(_shapes_and_average, world_size=3, timeout=300)
    for same, got, expected, avg in per_rank:
        assert same, "in-place ring must return the tensor it was given"
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(avg, torch.full((7,), 1.0))  # mean of ranks 0, 1, 2


def test_ring_trace_shows_reduce_scatter_then_all_gather():
    world = 4
    per_rank = launch.spawn(collectives.ring_trace, world_size=world, timeout=300)
    full = 2**world - 1  # every rank's contribution 2**r summed
    for r, res in enumerate(per_rank):
        assert res["equal"]
        trace = res["trace"]
        assert [t["phase"] for t in trace] == ["start"] + ["reduce-scatter"] * 3 + [
            "all-gather"
        ] * 3
        after_rs = trace[world - 1]["state"]
        # after reduce-scatter rank r owns the finished chunk (r + 1) % N ...
        assert after_rs[(r + 1) % world] == full
        # ... and no other chunk is finished yet
        assert sum(v == full for v in after_rs) == 1
        assert trace[-1]["state"] == [full] * world


def test_chunk_bounds_match_tensor_split():
    for numel in (0, 1, 3, 10, 11):
        for world in (1, 2, 3, 4):
            parts = torch.tensor_split(torch.arange(numel), world)
            bounds = collectives.chunk_bounds(numel, world)
            assert [b - a for a, b in bounds] == [len(p) for p in parts]
            assert [a for a, _ in bounds if numel] == [
                sum(len(q) for q in parts[:i]) for i in range(world) if numel
            ]


def test_demo_collectives_on_three_ranks():
    res = launch.spawn(collectives.demo_collectives, world_size=3, timeout=300)
    starts = [torch.tensor(r["all_reduce"][0]) for r in res]
    total = sum(starts)
    for rank, r in enumerate(res):
        assert r["broadcast"][1] == starts[0].tolist()
        assert r["all_reduce"][1] == total.tolist()
        assert r["all_gather"][1] == torch.cat(starts).tolist()
        assert r["reduce_scatter"][1] == torch.tensor_split(total, 3)[rank].tolist()
    assert res[0]["reduce"][1] == total.tolist()


def test_bench_and_timing_reject_bad_input_with_a_clear_message():
    from helpers.course.bench import allreduce

    with pytest.raises(SystemExit, match="world sizes >= 2"):
        allreduce.main(["--ranks", "1"])
    with pytest.raises(SystemExit, match="comma-separated"):
        allreduce.main(["--ranks", "two"])
    with pytest.raises(launch.RankFailure, match="unknown all-reduce 'tree'"):
        launch.spawn(collectives.time_all_reduce, world_size=2, args=("tree", 8), timeout=120)


def test_pingpong_and_measure_report_median_and_spread():
    from helpers.parallel.collectives import costmodel

    # 4 KB against 16 MiB: at 1 MiB a busy 2-core box sometimes timed the larger message
    # faster (scheduling noise of ~0.1 ms); 16 MiB takes milliseconds on any machine
    pp = launch.spawn(collectives.pingpong, world_size=2, args=([4096, 16 << 20], 4))[0]
    assert [r["bytes"] for r in pp] == [4096, 16 << 20]
    assert all(r["lo"] <= r["seconds"] <= r["hi"] and r["repeats"] == 4 for r in pp)
    ab = costmodel.fit_pingpong([r["bytes"] for r in pp], [r["seconds"] for r in pp])
    assert ab.alpha >= 0 and ab.beta > 0  # a megabyte takes longer than 4 KB
    rows = launch.spawn(collectives.measure, world_size=2, args=([4096], ("ring", "ps"), 3))[0]
    assert {r["algo"] for r in rows} == {"ring", "ps"}
    assert all(r["lo"] <= r["seconds"] <= r["hi"] for r in rows)


def _on_the_standin_gpu(d):
    """The ring (7 elements: uneven chunks; 1 element: empty ones), the parameter server and
    the ping-pong on stand-in GPU ranks, whose group refuses what would hang on NCCL."""
    x = torch.arange(7.0, device=d.device) * (d.rank + 1)
    ring = collectives.ring_all_reduce(d, x, inplace=False)
    tiny = collectives.ring_all_reduce(d, torch.ones(1, device=d.device))
    ps = collectives.ps_all_reduce(d, x.clone())
    rows = collectives.pingpong(d, [64], repeats=1, warmup=0)
    return ring.device.type, ring.tolist(), tiny.tolist(), ps.tolist(), len(rows)


@pytest.mark.parametrize("world", [2, 3])
def test_the_workbooks_point_to_point_keeps_nccls_rules_on_the_stand_in_gpu(world):
    """Each ring step goes as one batch_isend_irecv, the server and the ping-pong in matched
    order: the stand-in's NCCL model passes them (the ring as isend then recv, this module
    before issue 39, fails there on both sizes)."""
    per_rank = launch.spawn(_on_the_standin_gpu, world_size=world, backend="standin", timeout=120)
    total = sum(range(1, world + 1))
    for rank, (kind, ring, tiny, ps, rows) in enumerate(per_rank):
        assert kind == "gpu", f"rank {rank}'s ring came back on {kind}, not the stand-in GPU"
        assert ring == ps == [total * i for i in range(7)], (rank, ring, ps)
        assert tiny == [float(world)] and rows == 1, (rank, tiny, rows)
