"""Hand-written tensor parallelism on real gloo ranks equals the serial layers (fp32, 1e-5).

Column and row layers, the Megatron MLP, attention split by heads and a whole decoder:
outputs, input gradients and weight gradients (each rank's slice of the serial ones), and
the collectives each layer ran (which, forward or backward, how many bytes). Greedy
generation with a head-sharded key-value cache gives exactly the unsharded tokens.
"""

import pytest
import torch
from torch import nn

from helpers import launch
from helpers.parallel.tensor import tp as TP
from helpers.parallel.tensor import tp_inference as TI

TOL = {"rtol": 1e-5, "atol": 1e-5}
WORLDS = [2, 4]


def _data(seed: int, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _linear(fan_in: int, fan_out: int, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(fan_in, fan_out)


def _serial(layer: nn.Module, x: torch.Tensor, r: torch.Tensor):
    """Output, input gradient and parameter gradients of loss = sum(layer(x) * r)."""
    x = x.clone().requires_grad_()
    y = layer(x)
    (y * r).sum().backward()
    return y.detach(), x.grad, {n: p.grad for n, p in layer.named_parameters()}


def _column_rank(d, gather: bool):
    x, r = _data(1, 3, 5, 16), _data(2, 3, 5, 32)
    log = TP.CommLog()
    layer = TP.ColumnParallelLinear(_linear(16, 32), gather_output=gather, log=log)
    xx = x.clone().requires_grad_()
    y = layer(xx)
    mine = r if gather else r.chunk(d.world_size, dim=-1)[d.rank]  # loss on what this rank holds
    # gathered: every rank computes the same (replicated) loss, Megatron's convention;
    # not gathered: each rank its part of the loss, and f sums the input gradients.
    (y * mine).sum().backward()
    return y.detach(), xx.grad, layer.weight.grad, layer.bias.grad, log.comms


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("gather", [False, True])
def test_column_parallel_equals_linear(world, gather):
    y_ref, gx_ref, g_ref = _serial(_linear(16, 32), _data(1, 3, 5, 16), _data(2, 3, 5, 32))
    for rank, (y, gx, gw, gb, comms) in enumerate(launch.spawn(_column_rank, world, (gather,))):
        want_y = y_ref if gather else y_ref.chunk(world, dim=-1)[rank]
        torch.testing.assert_close(y, want_y, **TOL)
        torch.testing.assert_close(gw, g_ref["weight"].chunk(world, dim=0)[rank], **TOL)
        torch.testing.assert_close(gb, g_ref["bias"].chunk(world, dim=0)[rank], **TOL)
        torch.testing.assert_close(gx, gx_ref, **TOL)  # f summed the ranks' partial dL/dx
        ops = [(c.op, c.phase) for c in comms]
        expected = [("all_reduce", "backward")]
        if gather:
            expected = [("all_gather", "forward"), ("all_reduce", "backward")]
        assert ops == expected, f"rank {rank}: {ops}"
        assert comms[-1].nbytes == 3 * 5 * 16 * 4  # dL/dx, [3, 5, 16] fp32
        if gather:
            assert comms[0].nbytes == 3 * 5 * 32 * 4
            assert comms[0].sent == pytest.approx((world - 1) / world * 3 * 5 * 32 * 4)


def _row_rank(d, input_is_parallel: bool):
    x, r = _data(1, 3, 5, 32), _data(2, 3, 5, 16)
    log = TP.CommLog()
    layer = TP.RowParallelLinear(_linear(32, 16), input_is_parallel=input_is_parallel, log=log)
    xx = (x.chunk(d.world_size, dim=-1)[d.rank] if input_is_parallel else x).clone()
    xx.requires_grad_()
    y = layer(xx)
    (y * r).sum().backward()  # y is whole on every rank: the same (replicated) loss
    return y.detach(), xx.grad, layer.weight.grad, layer.bias.grad, log.comms


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("input_is_parallel", [True, False])
def test_row_parallel_equals_linear(world, input_is_parallel):
    y_ref, gx_ref, g_ref = _serial(_linear(32, 16), _data(1, 3, 5, 32), _data(2, 3, 5, 16))
    out = launch.spawn(_row_rank, world, (input_is_parallel,))
    for rank, (y, gx, gw, gb, comms) in enumerate(out):
        torch.testing.assert_close(y, y_ref, **TOL)
        torch.testing.assert_close(gw, g_ref["weight"].chunk(world, dim=1)[rank], **TOL)
        torch.testing.assert_close(gb, g_ref["bias"], **TOL)
        want_gx = gx_ref.chunk(world, dim=-1)[rank] if input_is_parallel else gx_ref
        torch.testing.assert_close(gx, want_gx, **TOL)
        ops = [(c.op, c.phase) for c in comms]
        expected = [("all_reduce", "forward")]
        if not input_is_parallel:
            expected.append(("all_gather", "backward"))
        assert ops == expected, f"rank {rank}: {ops}"
        assert comms[0].nbytes == 3 * 5 * 16 * 4
        assert comms[0].sent == pytest.approx(2 * (world - 1) / world * 3 * 5 * 16 * 4)


def _block_rank(d, kind: str):
    x, r = _data(1, 2, 6, 32), _data(2, 2, 6, 32)
    log = TP.CommLog()
    if kind == "mlp":
        torch.manual_seed(0)
        layer = TP.ParallelMLP(TI.MLP(32, 64), log=log)
    else:
        torch.manual_seed(0)
        layer = TP.ParallelAttention(TI.Attention(32, 4), log=log)
    xx = x.clone().requires_grad_()
    y = layer(xx)
    (y * r).sum().backward()
    grads = {n.replace("inner.", ""): p.grad for n, p in layer.named_parameters()}
    return y.detach(), xx.grad, grads, log.comms


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("kind", ["mlp", "attention"])
def test_megatron_pairs_equal_serial_with_one_all_reduce_each_way(world, kind):
    torch.manual_seed(0)
    serial = TI.MLP(32, 64) if kind == "mlp" else TI.Attention(32, 4)
    y_ref, gx_ref, g_ref = _serial(serial, _data(1, 2, 6, 32), _data(2, 2, 6, 32))
    for rank, (y, gx, grads, comms) in enumerate(launch.spawn(_block_rank, world, (kind,))):
        torch.testing.assert_close(y, y_ref, **TOL)
        torch.testing.assert_close(gx, gx_ref, **TOL)
        for name, g in grads.items():
            layer = name.split(".")[0]
            want = g_ref[name]
            if layer in ("fc1", "q", "k", "v"):
                want = want.chunk(world, dim=0)[rank]
            elif name in ("fc2.weight", "o.weight"):
                want = want.chunk(world, dim=1)[rank]
            torch.testing.assert_close(g, want, **TOL, msg=lambda m, n=name: f"{n}: {m}")
        # the Megatron pairing: one all-reduce forward (g), one backward (f), of [2, 6, 32]
        assert [(c.op, c.phase) for c in comms] == [
            ("all_reduce", "forward"),
            ("all_reduce", "backward"),
        ]
        assert all(c.nbytes == 2 * 6 * 32 * 4 for c in comms)


def _decoder_rank(d, tokens, targets):
    log = TP.CommLog()
    model = TI.shard_decoder(TI.tiny_decoder(), log=log)
    logits = model(tokens)
    nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
    return (
        logits.detach(),
        TI.local_grads(model),
        log.count("all_reduce", "forward"),
        log.count(None, "backward"),
    )


@pytest.mark.parametrize("world", WORLDS)
def test_sharded_decoder_forward_and_backward_equal_serial(world):
    g = torch.Generator().manual_seed(3)
    tokens, targets = (
        torch.randint(0, 64, (2, 8), generator=g),
        torch.randint(0, 64, (2, 8), generator=g),
    )
    serial = TI.tiny_decoder()
    logits_ref = serial(tokens)
    nn.functional.cross_entropy(logits_ref.flatten(0, 1), targets.flatten()).backward()
    layers = serial.cfg.n_layers
    for rank, (logits, grads, n_fwd, n_bwd) in enumerate(
        launch.spawn(_decoder_rank, world, (tokens, targets))
    ):
        torch.testing.assert_close(logits, logits_ref.detach(), **TOL)
        want = TI.shard_names(serial, rank, world, grads=True)
        assert sorted(grads) == sorted(want)
        for name, gr in grads.items():
            torch.testing.assert_close(gr, want[name], **TOL, msg=lambda m, n=name: f"{n}: {m}")
        assert n_fwd == n_bwd == 2 * layers  # attention + MLP per block, each way


def _generate_rank(d, prompt, new_tokens):
    model = TI.shard_decoder(TI.tiny_decoder())
    tokens, cache = TI.generate(model, prompt, new_tokens)
    return tokens, cache.nbytes(), tuple(cache.k[0].shape)


@pytest.mark.parametrize("world", WORLDS)
def test_sharded_greedy_generation_gives_the_unsharded_tokens(world):
    prompt = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(7))
    serial = TI.tiny_decoder()
    ref, cache = TI.generate(serial, prompt, 12)
    no_cache, _ = TI.generate(serial, prompt, 12, use_cache=False)
    assert torch.equal(ref, no_cache)
    for rank, (tokens, nbytes, shape) in enumerate(
        launch.spawn(_generate_rank, world, (prompt, 12))
    ):
        assert torch.equal(tokens, ref), f"rank {rank}: {tokens} != {ref}"
        assert shape == (2, serial.cfg.n_heads // world, 5 + 11, serial.cfg.head_dim)
        assert nbytes * world == cache.nbytes()  # the cache is sharded by heads
