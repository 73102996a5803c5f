"""The alpha-beta model: formula values and fitting known parameters back."""

import numpy as np
import pytest

from helpers.parallel.collectives import costmodel
from helpers.parallel.collectives.costmodel import AlphaBeta


def test_ring_formula_values():
    ab = AlphaBeta(alpha=1e-5, beta=1e-9)
    # N=4, 4 MB: 6 steps, each rank sends 2*3/4 * 4 MB = 6 MB
    n = 4 * 2**20
    assert costmodel.steps("ring", 4) == 6
    assert costmodel.bytes_per_rank("ring", n, 4) == pytest.approx(1.5 * n)
    assert costmodel.predict("ring", n, 4, ab) == pytest.approx(6e-5 + 1.5 * n * 1e-9)
    # one rank: nothing to do
    assert costmodel.predict("ring", n, 1, ab) == 0.0


def test_ps_traffic_grows_with_ranks_ring_does_not():
    n = 1e6
    ring = [costmodel.bytes_per_rank("ring", n, w) for w in (2, 4, 8, 64)]
    ps = [costmodel.bytes_per_rank("ps", n, w) for w in (2, 4, 8, 64)]
    assert ring == pytest.approx([n, 1.5 * n, 1.75 * n, 2 * 63 / 64 * n])
    assert all(r < 2 * n for r in ring)  # bounded by 2n
    assert ps == pytest.approx([2 * n, 6 * n, 14 * n, 126 * n])  # 2(N-1)n at the server


def test_predict_broadcasts_over_arrays():
    ab = AlphaBeta(alpha=2e-5, beta=5e-10)
    sizes = np.array([1e3, 1e6])
    out = costmodel.predict("ps", sizes, 3, ab)
    assert out.shape == (2,)
    assert out == pytest.approx(4 * 2e-5 + 4 * sizes * 5e-10)


@pytest.mark.parametrize("algo", ["ring", "ps"])
def test_fit_recovers_known_alpha_beta(algo):
    true = AlphaBeta(alpha=3e-5, beta=2e-10)
    sizes = np.array([2**k for k in range(10, 25, 2)] * 3, dtype=float)
    worlds = np.repeat([2, 3, 4], len(sizes) // 3)
    t = costmodel.predict(algo, sizes, worlds, true)
    got = costmodel.fit(algo, sizes, worlds, t)
    assert got.alpha == pytest.approx(true.alpha, rel=1e-6)
    assert got.beta == pytest.approx(true.beta, rel=1e-6)
    # with 5 % multiplicative noise it is still close
    rng = np.random.default_rng(0)
    noisy = t * rng.uniform(0.95, 1.05, size=t.shape)
    got = costmodel.fit(algo, sizes, worlds, noisy)
    assert got.alpha == pytest.approx(true.alpha, rel=0.15)
    assert got.beta == pytest.approx(true.beta, rel=0.15)


def test_fit_errors_say_what_to_change():
    with pytest.raises(ValueError, match="two message sizes"):
        costmodel.fit("ring", [1024, 1024], [2, 2], [1e-4, 1.1e-4])
    with pytest.raises(ValueError, match="positive"):
        costmodel.fit("ring", [1024, 4096], [2, 2], [0.0, 1e-4])
    with pytest.raises(ValueError, match="unknown algorithm"):
        costmodel.steps("tree", 4)
    assert "GB/s" in str(AlphaBeta(1e-5, 1e-9))


def test_bytes_counted_the_same_way_and_builtin_is_a_ring():
    n = 1e6
    # the busiest rank sends (and receives) this much: ring 2(N-1)/N n, server (N-1) n
    assert costmodel.bytes_sent("ring", n, 4) == pytest.approx(1.5 * n)
    assert costmodel.bytes_sent("ps", n, 4) == pytest.approx(3 * n)
    ab = AlphaBeta(alpha=1e-5, beta=1e-9)
    assert costmodel.predict("builtin", n, 4, ab) == costmodel.predict("ring", n, 4, ab)
    # bus bandwidth: 2(N-1)/N n / t, for any algorithm
    assert costmodel.bus_bandwidth(n, 4, 1e-3) == pytest.approx(1.5e9)


def test_fit_pingpong_recovers_alpha_beta():
    sizes = np.array([2**k for k in range(10, 25, 2)], dtype=float)
    t = 4e-5 + sizes * 3e-10
    got = costmodel.fit_pingpong(sizes, t)
    assert got.alpha == pytest.approx(4e-5, rel=1e-6)
    assert got.beta == pytest.approx(3e-10, rel=1e-6)
    with pytest.raises(ValueError, match="two or more"):
        costmodel.fit_pingpong([1024, 1024], [1e-4, 1e-4])


def test_fit_pingpong_takes_beta_from_the_large_messages_only():
    # Small messages slowed by a scheduler (a latency-bound regime with its own slope) must not
    # tilt beta: a line through every size would; the large-message slope does not.
    sizes = np.array([2**k for k in range(10, 25, 2)], dtype=float)
    t = 4e-5 + sizes * 3e-10
    t[sizes < 2**20] += 2e-4 * np.arange((sizes < 2**20).sum())  # noise growing with size
    got = costmodel.fit_pingpong(sizes, t, large_from=2**20)
    assert got.beta == pytest.approx(3e-10, rel=1e-6)
    everything = np.polyfit(sizes, t, 1)[0]
    assert abs(everything / 3e-10 - 1) > 0.05  # the all-sizes line would be off


def test_bus_bandwidth_model_ring_flat_in_n_server_falls():
    ab = AlphaBeta(alpha=0.0, beta=1e-9)
    ring = [costmodel.bus_bandwidth_model("ring", 2**30, n, ab) for n in (2, 4, 8)]
    ps = [costmodel.bus_bandwidth_model("ps", 2**30, n, ab) for n in (2, 4, 8)]
    assert ring == pytest.approx([1e9] * 3)
    assert ps == pytest.approx([1e9 / 2, 1e9 / 4, 1e9 / 8])


def test_fit_sweep_recovers_the_ring_of_a_synthetic_sweep():
    from helpers.parallel.collectives import published_comm as pub

    n, ranks, ab = np.array(pub.SWEEP_H200["bytes"], dtype=float), 8, AlphaBeta(2e-6, 1 / 400e9)
    busbw = costmodel.bus_bandwidth_model("ring", n, ranks, ab) / pub.GB
    got = pub.fit_sweep(n, busbw, ranks)
    assert got.alpha == pytest.approx(ab.alpha, rel=1e-6)
    assert got.beta == pytest.approx(ab.beta, rel=1e-6)
