"""Notebook 03 section 2c on real gloo ranks: unused parameters, bucket order, compression hooks."""

import pytest
import torch
from torch import nn

from helpers import launch
from helpers.parallel.data import bucket_order, compression, unused


def _small():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 4))


def _everything(d, x, y):
    return {
        "hang": unused.case(d, ["ab", "a"], find_unused=False, timeout_s=1.0),
        "found": unused.case(d, ["ab", "a"], find_unused=True, timeout_s=1.0),
        "order": {
            f: bucket_order.launches(
                d,
                bucket_order.Misordered(width=32),
                torch.randn(8, 32),
                steps=2,
                cap_mb=0.004,
                find_unused=f,
            )
            for f in (False, True)
        },  # fmt: skip
        "hooks": {h: compression.measure(d, _small, x, y, h, steps=4) for h in compression.HOOKS},
    }


@pytest.fixture(scope="module")
def ranks():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 32, generator=g), torch.randint(0, 4, (64,), generator=g)
    return launch.spawn(_everything, world_size=2, args=(x, y), timeout=120)


def test_a_parameter_unused_on_one_rank_hangs_its_peer_until_the_timeout(ranks):
    r0, r1 = (r["hang"] for r in ranks)
    assert r0["outcome"] == "RuntimeError" and r0["seconds"] >= 0.9 and r0["step"] == 0
    assert (
        "finished reduction" in r1["message"] and r1["step"] == 1
    )  # rank 1 fails fast at its next forward
    found = [r["found"] for r in ranks]
    assert all(f["outcome"] == "ok" for f in found) and found[0]["grad_b"] == found[1]["grad_b"] > 0


def _holder(step, name):
    return next(b["index"] for b in step["buckets"] if name in b["params"])


def test_buckets_are_rebuilt_in_backward_order_unless_unused_parameters_are_searched(ranks):
    rebuilt, guessed = ranks[0]["order"][False], ranks[0]["order"][True]
    assert len(rebuilt[0]["buckets"]) == 1  # step 0: one bucket, after backward
    assert _holder(rebuilt[1], "l3.weight") == 0 < _holder(rebuilt[1], "l0.weight")
    assert all(_holder(s, "l0.bias") < _holder(s, "l3.weight") for s in guessed)  # the guess, kept


def test_compression_hooks_send_the_modelled_bytes_and_approximate_as_expected(ranks):
    hooks = ranks[0]["hooks"]
    fp32 = 4 * sum(p.numel() for p in _small().parameters())
    assert (
        hooks["fp32 all-reduce"]["bytes"] == [fp32] * 4
        and max(hooks["fp32 all-reduce"]["error"]) == 0
    )
    assert hooks["bf16"]["bytes"][-1] * 2 == fp32 and max(hooks["bf16"]["error"]) < 0.01
    for r in (1, 4):
        sent = hooks[f"PowerSGD rank {r}"]["bytes"]
        assert sent[:2] == [fp32] * 2 and sent[-1] == compression.powersgd_bytes(_small(), r) < fp32
    # Rank 4: Linear(32, 16) sends (16 + 32) x 4 values, not 512; Linear(16, 4) would send (4 + 16) x 4 = 80
    # for 64, less than 2x shrunk, so it goes whole, as do the biases (the measured bytes above agree).
    assert compression.powersgd_bytes(_small(), 4) == 4 * ((16 + 32) * 4 + 16 + 64 + 4)


def test_split_fit_and_exposed_time_model():
    g = 1 << 20
    alpha, beta = bucket_order.fit_split(g, [(n, n * 1e-4 + g * 2e-9) for n in (1, 4, 16)])
    assert alpha == pytest.approx(1e-4) and beta == pytest.approx(2e-9)
    # Scattered large-n points (a busy machine): an ordinary least-squares line puts G beta below
    # zero here; the fit by relative error still reproduces the 1-bucket time (review M1).
    rows = [(1, 2.75e-3), (4, 3.0e-3), (16, 6.0e-3), (64, 12.0e-3), (256, 80e-3)]
    alpha, beta = bucket_order.fit_split(g, rows)
    assert alpha > 0 and beta > 0 and 1 / 1.5 < (alpha + g * beta) / rows[0][1] < 1.5, (alpha, beta)
    with pytest.raises(ValueError, match="two different bucket counts"):
        bucket_order.fit_split(g, [(4, 1e-3), (4, 2e-3)])
    # The last bucket is always exposed; others only past the backward window.
    assert bucket_order.exposed_time(g, g, 1e-4, 1e-9, 1.0) == pytest.approx(1e-4 + g * 1e-9)
    assert bucket_order.exposed_time(g, g // 4, 1e-4, 1e-9, 1.0) == pytest.approx(
        1e-4 + g // 4 * 1e-9
    )
    assert bucket_order.exposed_time(g, g // 4, 1e-4, 1e-9, 0.0) == pytest.approx(4e-4 + g * 1e-9)
