"""Sequence parallelism by hand, the vocabulary split, the overlapped column layer and the
per-rank memory of helpers.parallel.tensor.tp_{sp,vocab,async,memory}, on 2 real gloo ranks.

Each equals the serial model (fp32, 1e-5), and runs the collectives it is written to run:
the sequence-parallel decoder 2 all-gathers + 2 reduce-scatters per block forward and the
backward re-gathers; the parallel cross-entropy 3 all-reduces of one number per token; the
overlapped column layer the same all-reduce as the synchronous one, never waited for before
dW. Memory: what a rank measures equals the count of tp_memory, to the byte.

One spawn of 2 ranks runs every case (module fixture): the tests read its results.
"""

import pytest
import torch
from torch import nn

from helpers import launch
from helpers.parallel.tensor import tp as TP
from helpers.parallel.tensor import tp_async as TA
from helpers.parallel.tensor import tp_inference as TI
from helpers.parallel.tensor import tp_memory as TM
from helpers.parallel.tensor import tp_sp as SP
from helpers.parallel.tensor import tp_vocab as TV

TOL = {"rtol": 1e-5, "atol": 1e-5}
WORLD = 2
MEM_CFG = TI.DecoderConfig(dim=32, n_heads=4, hidden=128, n_layers=2, max_len=64)


def _batch():
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, 64, (2, 8), generator=g), torch.randint(0, 64, (2, 8), generator=g)


def _loss(logits, targets):
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _sp_case(tokens, targets):
    log = TP.CommLog()
    model = SP.shard_decoder_sp(TI.tiny_decoder(), log=log)
    logits = model(tokens)
    _loss(logits, targets).backward()
    n_synced = SP.sync_sequence_parallel_grads(model, log=log)
    return logits.detach(), TI.local_grads(model), [(c.op, c.phase) for c in log.comms], n_synced


def _vocab_case(tokens, targets):
    log = TP.CommLog()
    model = TI.shard_decoder(TI.tiny_decoder(), log=log)
    model.embed = TV.VocabParallelEmbedding(model.embed, log=log)
    model.head = TP.ColumnParallelLinear(model.head, log=log, name="head")  # logits [B, T, V/N]
    logits = model(tokens)
    loss = TV.vocab_parallel_cross_entropy(logits, targets, log=log)
    loss.backward()
    loss_comms = [c.nbytes for c in log.comms if c.layer.startswith("loss")]
    return loss.detach(), TI.local_grads(model), loss_comms, tuple(logits.shape)


def _async_case(x, overlap):
    torch.manual_seed(0)
    log = TP.CommLog(timed=True)
    layer = TA.AsyncColumnParallelLinear(nn.Linear(16, 32), log=log, overlap=overlap)
    xx = x.clone().requires_grad_()
    y = layer(xx)
    y.pow(2).sum().backward()
    return y.detach(), xx.grad, layer.weight.grad, layer.bias.grad, log.phases[0]


def _all_cases(d, tokens, targets, x):
    memory = {lay: TM.measure_rank(d, MEM_CFG, 2, 16, lay) for lay in TM.LAYOUTS}
    return {
        "sp": _sp_case(tokens, targets),
        "vocab": _vocab_case(tokens, targets),
        "async": {ov: _async_case(x, ov) for ov in (False, True)},
        "memory": memory,
    }


@pytest.fixture(scope="module")
def runs():
    tokens, targets = _batch()
    x = torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(1))
    serial = TI.tiny_decoder()
    logits = serial(tokens)
    loss = _loss(logits, targets)
    loss.backward()
    out = launch.spawn(_all_cases, WORLD, (tokens, targets, x))
    return {
        "ranks": out,
        "serial": serial,
        "logits": logits.detach(),
        "loss": loss.detach(),
        "x": x,
    }


def _assert_grads(grads, want, where):
    assert sorted(grads) == sorted(want), where
    for name, g in grads.items():
        torch.testing.assert_close(g, want[name], **TOL, msg=lambda m, n=name: f"{where} {n}: {m}")


def test_sequence_parallel_by_hand_equals_serial_and_regathers_in_backward(runs):
    n_layers = runs["serial"].cfg.n_layers
    for rank, out in enumerate(runs["ranks"]):
        logits, grads, comms, n_synced = out["sp"]
        torch.testing.assert_close(logits, runs["logits"], **TOL)
        _assert_grads(
            grads, TI.shard_names(runs["serial"], rank, WORLD, grads=True), f"rank {rank}"
        )
        fwd = [op for op, phase in comms if phase == "forward"]
        back = [op for op, phase in comms if phase == "backward"]
        # forward: f' (all-gather) and g' (reduce-scatter) per pair, + the final norm's gather
        assert (
            fwd.count("all_gather") == 2 * n_layers + 1
            and fwd.count("reduce_scatter") == 2 * n_layers
        )
        # backward: f' reduce-scatters, g' all-gathers, the column inputs gathered again,
        # + the first block's input gradient gathered back
        assert back.count("reduce_scatter") == 2 * n_layers
        assert back.count("all_gather") == 4 * n_layers + 1
        assert [op for op, phase in comms if phase == "after backward"] == ["all_reduce"]
        assert n_synced == 6 * n_layers  # 2 norms x (weight, bias) + o's and fc2's biases


def test_vocab_parallel_embedding_and_loss_equal_serial(runs):
    serial, n_tokens = runs["serial"], runs["logits"].shape[0] * runs["logits"].shape[1]
    for rank, out in enumerate(runs["ranks"]):
        loss, grads, loss_comms, shape = out["vocab"]
        torch.testing.assert_close(loss, runs["loss"], **TOL)
        want = TI.shard_names(serial, rank, WORLD, grads=True)
        for name in ("embed.weight", "head.weight"):  # split by vocabulary rows
            module, kind = name.split(".")
            want[name] = getattr(getattr(serial, module), kind).grad.chunk(WORLD, dim=0)[rank]
        _assert_grads(grads, want, f"rank {rank}")
        assert shape[-1] == serial.cfg.vocab // WORLD  # never the whole vocabulary
        assert loss_comms == [n_tokens * 4] * 3  # max, sum of exp, target logit: fp32 per token


def test_overlapped_column_layer_equals_synchronous_and_serial(runs):
    torch.manual_seed(0)
    full = nn.Linear(16, 32)
    x = runs["x"].clone().requires_grad_()
    y = full(x)
    y.pow(2).sum().backward()
    for rank, out in enumerate(runs["ranks"]):
        for overlap, (y_r, gx, gw, gb, phases) in out["async"].items():
            torch.testing.assert_close(y_r, y.detach().chunk(WORLD, dim=-1)[rank], **TOL)
            torch.testing.assert_close(gx, x.grad, **TOL)  # the all-reduce summed the partials
            torch.testing.assert_close(gw, full.weight.grad.chunk(WORLD, dim=0)[rank], **TOL)
            torch.testing.assert_close(gb, full.bias.grad.chunk(WORLD, dim=0)[rank], **TOL)
            # synchronous: the all-reduce is timed between dX and dW; overlapped: in flight
            assert (phases["comm"] == "in flight") == overlap


@pytest.mark.parametrize("layout", list(TM.LAYOUTS))
def test_measured_memory_per_rank_equals_the_count(runs, layout):
    unsharded = TI.tiny_decoder(MEM_CFG)
    states = TM.state_values(unsharded, WORLD)
    n_params = states["split"] + states["replicated"]
    repl, split = TM.activation_values(
        2 * 16, MEM_CFG.dim, MEM_CFG.hidden, MEM_CFG.n_heads, WORLD, layout
    )
    want = {
        "params": 4 * n_params,
        "grads": 4 * n_params,
        "optimizer": 8 * n_params,
        "activations": 4 * MEM_CFG.n_layers * (repl + split),
    }
    for rank, out in enumerate(runs["ranks"]):
        assert out["memory"][layout] == want, f"{layout} on rank {rank}"


def test_memory_counts_and_kv_heads():
    one = TM.activation_values(64, 32, 128, 4, 1, "tp")
    sp = TM.activation_values(64, 32, 128, 4, 4, "sp")
    tp = TM.activation_values(64, 32, 128, 4, 4, "tp")
    assert sum(sp) == sum(one) / 4 < sum(tp)  # SP divides everything; TP keeps a floor
    # Korthikanti et al. (2022), section 4: 34 + 5as/h; 10 + 24/t + ...; 34/t + ...
    assert TM.korthikanti_bytes(8, 1, 16, 2) == 8 * 16 * (34 + 5 * 2 * 8 / 16)
    assert TM.korthikanti_bytes(8, 1, 16, 2, 4) == 8 * 16 * (10 + 6 + 5 * 2 * 8 / 64)
    assert TM.korthikanti_bytes(8, 1, 16, 2, 4, sequence_parallel=True) == 8 * 16 * (8.5 + 1.25)
    with pytest.raises(ValueError, match="layout"):
        TM.activation_values(64, 32, 128, 4, 2, "pp")
    assert TP.kv_heads_per_rank(8, 4) == (2, 1) and TP.kv_heads_per_rank(8, 16) == (1, 2)
    with pytest.raises(ValueError, match="multiple of it"):
        TP.kv_heads_per_rank(8, 12)
